"""The TRL-style adapter over the document-parsing rewards, and its registration."""

import pytest

from policyopt.envs.docparse.reward import docparse_reward, docparse_reward_function
from policyopt.rewards.functions import REWARD_FUNCTIONS, load_reward_function

TABLE = "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>"  # 7 nodes


def test_auto_picks_the_reward_named_by_each_row():
    scores = docparse_reward(
        ["p1", "p2", "p3"],
        ["kitten", TABLE.replace("<td>a</td><td>b</td>", "<td>a</td>"), "x^2"],
        reference=["sitting", TABLE, "x^3"],
        element_type=["text", "table", "formula"],
        trainer_state=None,  # TRL passes extra keywords: ignored
    )
    # text 1 - 3/7; table: one cell deleted at structure cost 2 -> 1 - 2/7; formula 0.2 * 2/3.
    assert scores == pytest.approx([1 - 3 / 7, 1 - 2 / 7, 0.2 * 2 / 3])


def test_fixed_kind_options_and_conversational_completions():
    teds_fn = docparse_reward_function("table", reference_column="html", structure_cost=1.0)
    assert teds_fn.__name__ == "docparse_table"
    missing = TABLE.replace("<td>a</td><td>b</td>", "<td>a</td>")
    conversation = [{"role": "assistant", "content": missing}]
    assert teds_fn(["p"], [conversation], html=[TABLE]) == pytest.approx([1 - 1 / 7])


def test_bad_batches_name_the_problem():
    with pytest.raises(KeyError, match="'reference' column"):
        docparse_reward(["p"], ["a"], element_type=["text"])
    with pytest.raises(KeyError, match="'element_type' column"):
        docparse_reward(["p"], ["a"], reference=["a"])
    with pytest.raises(ValueError, match="row 1: element_type 'image'"):
        docparse_reward(
            ["p", "q"], ["a", "b"], reference=["a", "b"], element_type=["text", "image"]
        )
    with pytest.raises(ValueError, match="2 values for 1 completions"):
        docparse_reward(["p"], ["a"], reference=["a", "b"], element_type=["text"])
    with pytest.raises(TypeError, match="row 0: completion"):
        docparse_reward(["p"], [3], reference=["a"], element_type=["text"])
    with pytest.raises(ValueError, match="kind 'html'"):
        docparse_reward_function("html")


def test_registered_names():
    for name in ("docparse", "docparse_text", "docparse_table", "docparse_formula"):
        assert name in REWARD_FUNCTIONS
    assert load_reward_function("docparse") is docparse_reward
    fn = load_reward_function("docparse_text")
    assert fn(["p"], ["abc"], reference=["abd"]) == pytest.approx([2 / 3])
