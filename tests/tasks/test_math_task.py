"""The math task: last-\\boxed{} extraction and math-verify equivalence."""

import json
import threading

import pytest

from policyopt.tasks import TASKS, MathTask, get_task
from policyopt.tasks.math_task import last_boxed


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    path = tmp_path_factory.mktemp("math") / "math.jsonl"
    rows = [
        {"problem": "Half of one?", "answer": "\\frac{1}{2}"},
        {"problem": "1+1?", "answer": "2"},
        {"problem": "Root of x^2=2, positive?", "answer": "\\boxed{\\sqrt{2}}"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return get_task("math", path=str(path))


def test_registered_and_prompt(task):
    assert "math" in TASKS and isinstance(task, MathTask)
    assert task.format_prompt(task.rows("train")[1]) == "1+1?\nPut the final answer in \\boxed{}."


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("so \\boxed{2}", "2"),
        ("\\boxed{1} then \\boxed{\\frac{3}{4}}.", "\\frac{3}{4}"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("no box", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize(
    ("index", "completion", "reward"),
    [
        (0, "It is \\boxed{0.5}", 1.0),  # \frac{1}{2} == 0.5
        (0, "\\boxed{\\dfrac{2}{4}}", 1.0),
        (0, "\\boxed{0.25}", 0.0),
        (1, "\\boxed{2}", 1.0),
        (1, "First \\boxed{3}, no wait: \\boxed{2}", 1.0),  # the last box counts
        (1, "\\boxed{2} is wrong, \\boxed{3}", 0.0),
        (1, "\\boxed{3}", 0.0),
        (1, "the answer is 2", None),  # no box
        (1, "\\boxed{}", None),
        (2, "\\boxed{2^{1/2}}", 1.0),  # gold already boxed
        (2, "\\boxed{1.5}", 0.0),
    ],
)
def test_verify(task, index, completion, reward):
    assert task.verify(completion, task.rows("train")[index]) == reward


def test_extract_answer(task):
    assert task.extract_answer("x \\boxed{ 12 } y") == "12"
    assert task.extract_answer("x") is None


def test_works_off_the_main_thread(task):
    row = task.rows("train")[0]
    results = []
    thread = threading.Thread(target=lambda: results.append(task.verify("\\boxed{0.5}", row)))
    thread.start()
    thread.join()
    assert results == [1.0]


def test_bad_timeout(task):
    with pytest.raises(ValueError, match="timeout_seconds"):
        MathTask("unused.jsonl", timeout_seconds=0)


def test_boxed_format_reward_checks_for_a_closed_box() -> None:
    from policyopt.rewards.functions import load_reward_function

    fn = load_reward_function("boxed_format")
    completions = ["so \\boxed{12}", "\\boxed{\\frac{1}{2}} done", "\\boxed{12", "12", ""]
    assert fn([""] * 5, completions) == [1.0, 1.0, 0.0, 0.0, 0.0]
