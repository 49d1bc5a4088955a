"""The ranking rewards under hostile model output (pattern: `reward_properties.py`): NDCG
of a parsed ranking never raises, is None (unparseable) or in [0, 1], and is fast; a
permutation-valued completion is never None."""

from hypothesis import given
from hypothesis import strategies as st
from reward_properties import REWARD_SETTINGS, check_reward_function, hostile_text

from policyopt.rewards.functions import task_reward_function
from policyopt.rewards.ranked_text import ndcg_reward
from policyopt.tasks import get_task

BRACKETS = [
    "[1]",
    "[2]",
    "[3]",
    "[4]",
    "[0]",
    "[99999999999999999999]",
    " > ",
    ">",
    "[",
    "]",
    "[ 3 ]",
]
ITEMS = ["i1", "i2", "i3", "i4", "i0", "i999999999999", " ", "i", "1"]
LABELS = [3.0, 0.0, 1.0, 2.0]


@REWARD_SETTINGS
@given(completions=st.lists(hostile_text(BRACKETS), min_size=1, max_size=8))
def test_ndcg_reward_bracket_form(completions):
    columns = {"labels": [LABELS] * len(completions)}
    check_reward_function(ndcg_reward, completions, columns, low=0.0, high=1.0, seconds=2.0)


@REWARD_SETTINGS
@given(completions=st.lists(hostile_text(ITEMS), min_size=1, max_size=8))
def test_ndcg_reward_item_form(completions):
    columns = {"labels": [LABELS] * len(completions), "items": [[1, 2, 3, 4]] * len(completions)}
    check_reward_function(ndcg_reward, completions, columns, low=0.0, high=1.0, seconds=2.0)


@REWARD_SETTINGS
@given(st.permutations([0, 1, 2, 3]), st.integers(1, 4))
def test_any_permutation_scores_in_range(order, k):
    text = " > ".join(f"[{i + 1}]" for i in order)
    (value,) = ndcg_reward(["p"], [text], labels=[LABELS], ndcg_k=[k])
    assert value is not None and 0.0 <= value <= 1.0 + 1e-12
    best = sorted(range(4), key=lambda i: -LABELS[i])
    if order[:k] == best[:k]:
        assert abs(value - 1.0) < 1e-12


@REWARD_SETTINGS
@given(completions=st.lists(hostile_text(BRACKETS), min_size=1, max_size=6))
def test_rerank_task_verifier(completions):
    task = get_task("rerank", train_size=2, eval_size=1)
    row = task.rows("train")[0]
    columns = {k: [row[k]] * len(completions) for k in row}
    check_reward_function(
        task_reward_function(task), completions, columns, low=0.0, high=1.0, seconds=2.0
    )
