"""The edit grammar (`tasks/skilldoc/grammar.py`) against the edit parser it stands for."""

import numpy as np
import pytest

from policyopt.envs.ads.skilldoc.document import SkillDocument, read_edit
from policyopt.envs.ads.skilldoc.env import Outcome, render_prompt
from policyopt.envs.ads.skilldoc.grammar import (
    SkillEditGrammar,
    SkillRuleGrammar,
    edit_ebnf,
    prompt_document,
)
from policyopt.envs.ads.skilldoc.rule_agent import rule_setting
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT, random_document, scripted_edit

xgr = pytest.importorskip("xgrammar")

DOC = SkillDocument.from_dict({"ads": ["a", "b", "c", "d"], "ranking": ["x", "y"], "empty": []})


def accepts(doc: SkillDocument, text: str, content: str = "free") -> bool:
    """Whether `doc`'s edit grammar matches all of `text` and may then end (stop token)."""
    vocab = [chr(c) for c in range(32, 127)] + ["\n", ""]  # the last: the stop token
    stop = len(vocab) - 1
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[stop])
    grammar = xgr.GrammarCompiler(info).compile_grammar(edit_ebnf(doc, content))
    matcher = xgr.GrammarMatcher(grammar)
    return matcher.accept_string(text) and matcher.accept_token(stop)


@pytest.mark.parametrize(
    "text,ok",
    [
        ("insert ranking: set quality weight low\n", True),
        ("insert empty: a\n", True),
        ("insert ads: a\n", False),  # ads holds MAX_RULES_PER_SECTION rules
        ("replace ads 4: z\n", True),
        ("replace ranking 3: z\n", False),  # ranking has 2 rules
        ("delete ranking 2\n", True),
        ("delete empty 1\n", False),
        ("delete budget 1\n", False),  # no such section
        ("insert ranking: Upper\n", False),  # characters outside the rule alphabet
        ("insert ranking:  leading space\n", False),
        ("insert ranking: " + "a" * 60 + "\n", True),
        ("insert ranking: " + "a" * 61 + "\n", False),  # over MAX_RULE_CHARS
        ("insert ranking: a", False),  # no newline: not a complete edit
    ],
)
def test_grammar_accepts_exactly_these_edits(text: str, ok: bool) -> None:
    assert accepts(DOC, text) is ok
    if ok:  # every string the grammar accepts is an "ok" edit for the parser
        assert read_edit(text, DOC)[1] == "ok"


@pytest.mark.parametrize(
    "text,ok",
    [
        ("insert ranking: set quality weight low\n", True),
        ("replace ranking 1: explore new ads very high\n", True),
        ("insert ranking: keep ad load low\n", False),  # ad load's rules live in "ads"
        ("insert ranking: set quality weight\n", False),  # no level: the agent ignores it
        ("insert ranking: set quality weight lowish\n", False),
        (
            "insert ranking: cap repeadged adsers meium\n",
            False,
        ),  # a garbled rule an unconstrained editor wrote
        ("replace casual 1: send reminders medium\n", True),
        ("replace casual 1: set quality weight low\n", False),  # no such population rule
        ("insert loyal: keep ad load very low\n", True),
        ("delete ranking 2\n", True),
        ("insert empty: pace budgets high\n", True),  # an unknown section: any global rule
        ("insert empty: send reminders high\n", False),
    ],
)
def test_rule_grammar_accepts_only_rules_the_agent_reads(text: str, ok: bool) -> None:
    doc = SkillDocument.from_dict(
        {
            "ads": ["a"],
            "ranking": ["x", "y"],
            "casual": ["send reminders high"],
            "loyal": [],
            "empty": [],
        }
    )
    assert accepts(doc, text, "rules") is ok
    if ok:
        edit, status = read_edit(text, doc)
        assert status == "ok"
        if edit.action != "delete":  # every rule it lets through sets a parameter
            assert rule_setting(edit.content, edit.section) is not None


@pytest.mark.slow
@pytest.mark.parametrize("content", ["free", "rules"])
def test_every_demonstration_is_in_the_grammar(content: str) -> None:
    """The grammar must not forbid what the editor is trained to write (SFT targets)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        doc = random_document(rng)
        text = scripted_edit(doc, rng).text() + "\n"
        assert accepts(doc, text, content), (doc.render(), text)


def test_unknown_content_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="content"):
        edit_ebnf(DOC, "words")


def test_the_document_is_read_back_from_the_prompt() -> None:
    recent = [Outcome("delete ads 1", 0.01, (0.01, -0.02, 0.0, 0.03))]
    prompt = render_prompt(START_DOCUMENT, recent)
    assert prompt_document(prompt) == START_DOCUMENT
    assert SkillEditGrammar().ebnf(prompt) == edit_ebnf(START_DOCUMENT, "free")
    assert SkillRuleGrammar().ebnf(prompt) == edit_ebnf(START_DOCUMENT, "rules")


def test_the_probe_counts_rules_that_set_nothing() -> None:
    from studies.dmrl.grammar_probe import sets_a_parameter

    from policyopt.envs.ads.skilldoc.document import Edit

    assert sets_a_parameter(Edit("ranking", "replace", 0, "set quality weight low"))
    assert not sets_a_parameter(Edit("ranking", "replace", 0, "cap repeadged adsers meium"))
    assert sets_a_parameter(Edit("ranking", "delete", 0, ""))
    assert not sets_a_parameter(Edit("casual", "insert", 0, "set quality weight low"))


def test_the_document_is_found_inside_a_chat_template() -> None:
    """`model.chat_template=true` (the SmolLM2 editor): the engine decodes the templated
    prompt, so the grammar sees the role words around the document ('cannot read line
    "system"' before the fix)."""
    prompt = render_prompt(START_DOCUMENT, [])
    # SmolLM2's template as `batch_decode(skip_special_tokens=True)` returns it
    wrapped = f"system\nYou are a helpful AI assistant named SmolLM\nuser\n{prompt}\nassistant\n"
    assert prompt_document(wrapped) == START_DOCUMENT
    assert SkillRuleGrammar().ebnf(wrapped) == edit_ebnf(START_DOCUMENT, "rules")
    with pytest.raises(ValueError, match="no skill document"):
        prompt_document("system\nno document here\n")
