"""A file task's verifier for models that answer in sentences: `answer_match: last_number`."""

import json

import pytest

from policyopt.tasks import get_task


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [{"q": f"What is {a} + 7?", "a": str(a + 7)} for a in range(2, 8)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("The answer is 9.", 1.0),  # a sentence: exact match gives 0 here
        ("2 + 7 = 9", 1.0),  # the last number counts
        ("9 is not it, 10 is", 0.0),
        ("9.0", 1.0),  # the same number written another way
        ("-9", 0.0),
        ("nine", None),  # no number: unparseable, not wrong
    ],
)
def test_last_number_by_hand(path, completion, reward):
    task = get_task(
        "hf_dataset",
        path=path,
        prompt_column="q",
        answer_column="a",
        eval_fraction=0.5,
        answer_match="last_number",
    )
    row = {"q": "What is 2 + 7?", "a": "9"}
    assert task.verify(completion, row) == reward
    assert task.extract_answer("so 2 + 7 = 9.") == "9"


def test_exact_is_the_default_and_a_bad_mode_is_named(path):
    task = get_task(
        "hf_dataset", path=path, prompt_column="q", answer_column="a", eval_fraction=0.5
    )
    assert task.verify("The answer is 9.", {"a": "9"}) == 0.0
    assert task.verify(" 9 ", {"a": "9"}) == 1.0
    with pytest.raises(ValueError, match="answer_match must be one of"):
        get_task("hf_dataset", path=path, answer_match="closest")
