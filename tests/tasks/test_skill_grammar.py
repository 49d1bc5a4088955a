"""The edit grammar (`tasks/skilldoc/grammar.py`) against the edit parser it stands for."""

import numpy as np
import pytest

from policyopt.tasks.skilldoc.document import SkillDocument, read_edit
from policyopt.tasks.skilldoc.env import Outcome, render_prompt
from policyopt.tasks.skilldoc.grammar import SkillEditGrammar, edit_ebnf, prompt_document
from policyopt.tasks.skilldoc.scripted import START_DOCUMENT, random_document, scripted_edit

xgr = pytest.importorskip("xgrammar")

DOC = SkillDocument.from_dict({"ads": ["a", "b", "c", "d"], "ranking": ["x", "y"], "empty": []})


def accepts(doc: SkillDocument, text: str) -> bool:
    """Whether `doc`'s edit grammar matches all of `text` and may then end (stop token)."""
    vocab = [chr(c) for c in range(32, 127)] + ["\n", ""]  # the last: the stop token
    stop = len(vocab) - 1
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[stop])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(edit_ebnf(doc)))
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


def test_every_demonstration_is_in_the_grammar() -> None:
    """The grammar must not forbid what the editor is trained to write (SFT targets)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        doc = random_document(rng)
        text = scripted_edit(doc, rng).text() + "\n"
        assert accepts(doc, text), (doc.render(), text)


def test_the_document_is_read_back_from_the_prompt() -> None:
    recent = [Outcome("delete ads 1", 0.01, (0.01, -0.02, 0.0, 0.03))]
    prompt = render_prompt(START_DOCUMENT, recent)
    assert prompt_document(prompt) == START_DOCUMENT
    assert SkillEditGrammar().ebnf(prompt) == edit_ebnf(START_DOCUMENT)
