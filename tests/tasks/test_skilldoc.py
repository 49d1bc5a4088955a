"""Skill document, edit parsing, the rule-interpreter agent, the scripted editor."""

from __future__ import annotations

import numpy as np
import pytest

from policyopt.tasks.adsim.params import RANGES, AdParams
from policyopt.tasks.skilldoc.document import Edit, SkillDocument, parse_edit
from policyopt.tasks.skilldoc.rule_agent import RuleAgent
from policyopt.tasks.skilldoc.scripted import START_DOCUMENT, random_document, scripted_edit

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
