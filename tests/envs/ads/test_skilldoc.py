"""Skill document, edit parsing, the rule-interpreter agent, the scripted editor."""

from __future__ import annotations

import numpy as np
import pytest

from policyopt.envs.ads.adsim.params import RANGES, AdParams
from policyopt.envs.ads.skilldoc.document import Edit, SkillDocument, parse_edit
from policyopt.envs.ads.skilldoc.rule_agent import RuleAgent
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT, random_document, scripted_edit

DOC = SkillDocument.from_dict({"ads": ["keep ad load high", "cap repeated ads low"], "budget": []})


def test_render():
    assert DOC.render() == "[ads]\n1. keep ad load high\n2. cap repeated ads low\n[budget]"


@pytest.mark.parametrize(
    "text,edit",
    [
        ("insert budget: pace budgets low", Edit("budget", "insert", 0, "pace budgets low")),
        (
            "replace ads 2: cap repeated ads high\nmore",
            Edit("ads", "replace", 1, "cap repeated ads high"),
        ),
        ("  delete ads 1 ", Edit("ads", "delete", 0, "")),
    ],
)
def test_parse_valid_edits(text, edit):
    assert parse_edit(text, DOC) == edit


@pytest.mark.parametrize(
    "text",
    [
        "",
        "insert ads:",  # empty content
        "replace ads 3: keep ad load low",  # no rule 3
        "delete budget 1",  # empty section
        "insert pricing: keep ad load low",  # unknown section
        "move ads 1: x",  # unknown action
        "replace ads 0: keep ad load low",
        "insert ads: " + "x" * 61,  # too long
        "insert ads: <b>bold</b>",  # characters a rule may not hold
    ],
)
def test_malformed_edits_are_none(text):
    assert parse_edit(text, DOC) is None


def test_apply_each_action():
    assert DOC.apply(Edit("budget", "insert", 0, "pace budgets low")).rules("budget") == (
        "pace budgets low",
    )
    assert DOC.apply(Edit("ads", "replace", 1, "x")).rules("ads") == ("keep ad load high", "x")
    assert DOC.apply(Edit("ads", "delete", 0, "")).rules("ads") == ("cap repeated ads low",)


def test_rule_agent_levels_and_last_rule_wins():
    doc = SkillDocument.from_dict(
        {
            "a": ["keep ad load very high", "nonsense rule", "keep ad load low"],
            "b": ["pace budgets very low"],
        }
    )
    p = RuleAgent()(doc)
    lo, hi = RANGES["ad_load"]
    assert p.ad_load == pytest.approx(lo + 0.25 * (hi - lo))
    lo, hi = RANGES["pacing_rate"]
    assert p.pacing_rate == pytest.approx(lo + 0.05 * (hi - lo))
    assert p.quality_weight == AdParams().quality_weight  # unset: default


def test_scripted_edits_round_trip_and_stay_in_range():
    rng = np.random.default_rng(0)
    agent = RuleAgent()
    doc = START_DOCUMENT
    for _ in range(200):
        if rng.uniform() < 0.1:
            doc = random_document(rng)
        edit = scripted_edit(doc, rng)
        assert parse_edit(edit.text(), doc) == edit
        doc = doc.apply(edit)
        p = agent(doc)
        for name, (lo, hi) in RANGES.items():
            assert lo <= getattr(p, name) <= hi


@pytest.mark.slow
def test_live_environment_state_survives_a_checkpoint(tmp_path):
    """A resumed DMRL run continues the same environment: deployed document, day, recent
    outcomes and the deployed experiments (the LRP's memory bank), from plain data that
    `torch.load(weights_only=True)` accepts."""
    import torch

    from policyopt.envs.ads.skilldoc.task import SkillDocTask

    def run_days(task, days):
        env = task.env
        for day in range(days):
            edit = scripted_edit(env.document, np.random.default_rng(day))
            env.deploy(edit, lift=0.01 * (day % 2), index=day)

    first = SkillDocTask(seed=3, users_per_arm=40, eval_users=50, live_users=600)
    run_days(first, 3)
    torch.save(first.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)

    resumed = SkillDocTask(seed=3, users_per_arm=40, eval_users=50, live_users=600)
    resumed.load_state_dict(state)
    a, b = first.env, resumed.env
    assert b.document == a.document and b.day == a.day == 3
    assert b.recent == a.recent and b.deployed_days == a.deployed_days
    assert [e.id for e in b.experiments] == [e.id for e in a.experiments]
    for x, y in zip(a.experiments, b.experiments, strict=True):
        np.testing.assert_array_equal(x.pop_values, y.pop_values)
        assert x.control == y.control and x.treatment == y.treatment
    assert resumed.format_prompt({"prompt": "live"}) == first.format_prompt({"prompt": "live"})
    # the live population replayed to the same day and state (live world, the default)
    assert a.platform.world == "live" and a.platform.day == b.platform.day == 103
    np.testing.assert_array_equal(a.platform.live.state.annoy, b.platform.live.state.annoy)
    np.testing.assert_array_equal(
        a.platform.live.users.population, b.platform.live.users.population
    )


def test_read_edit_statuses_and_a_cut_edit_is_never_applied():
    from policyopt.envs.ads.skilldoc.document import read_edit

    doc = START_DOCUMENT
    assert read_edit("delete ads 1\n", doc)[1] == "ok"
    assert read_edit("delete ads 7\n", doc) == (None, "malformed")
    # the review's example: a cut replace parsed as a rule naming no level (a delete)
    assert read_edit("replace ads 1: cap repeated ads very hig", doc) == (None, "truncated")
    assert read_edit("\nreplace ads 1: keep ad load low", doc) == (None, "truncated")


def test_token_budget_holds_the_longest_demonstration():
    from policyopt.envs.ads.skilldoc.scripted import demonstration_texts, edit_token_budget
    from policyopt.models.tiny import build_char_tokenizer

    texts = demonstration_texts()
    longest = max(texts, key=len)
    assert longest == "replace ranking 1: set quality weight very high\n"
    assert edit_token_budget(build_char_tokenizer(), margin=8) == len(longest) + 1 + 8
    rng = np.random.default_rng(0)
    for _ in range(200):  # every scripted edit of a random document is in the list
        assert scripted_edit(random_document(rng), rng).text() + "\n" in set(texts)


def test_population_sections_set_that_population_s_parameters():
    """The edit grammar knows the parameters added with the live world: each population's
    section sets its own ad-load multiplier and reminders; the reserve price is global."""
    from policyopt.envs.ads.adsim.params import NAMES
    from policyopt.envs.ads.skilldoc.scripted import PHRASES, SECTIONS

    doc = START_DOCUMENT
    assert doc.names() == list(SECTIONS)
    for text, name, frac in (
        ("insert loyal: keep ad load low\n", "ad_load_loyal", 0.25),
        ("insert loyal: send reminders very high\n", "reminders_loyal", 0.95),
        ("replace clickers 1: keep ad load very low\n", "ad_load_clickers", 0.05),
        ("replace ranking 3: set reserve price low\n", "reserve_price", 0.25),
    ):
        edit = parse_edit(text, doc)
        assert edit is not None, text
        p = RuleAgent()(doc.apply(edit))
        lo, hi = RANGES[name]
        assert getattr(p, name) == pytest.approx(lo + frac * (hi - lo)), text
        # nothing else moved
        before = RuleAgent()(doc).as_dict()
        assert {k for k, v in p.as_dict().items() if v != before[k]} <= {name}
    # a population parameter outside its section, or a global one inside, does nothing
    agent = RuleAgent()
    assert agent(doc.apply(parse_edit("insert ads: send reminders high", doc))) == agent(doc)
    loyal = agent(doc.apply(parse_edit("insert loyal: set quality weight high", doc)))
    assert loyal == agent(doc)
    assert set(PHRASES) == set(NAMES)
    # every whitelisted parameter is reached by some demonstration
    rng = np.random.default_rng(1)
    reached = set()
    for _ in range(400):
        d = random_document(rng)
        reached |= {k for k, v in agent(d).as_dict().items() if v != AdParams().as_dict()[k]}
    assert reached == set(NAMES)
