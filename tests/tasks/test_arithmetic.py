"""The embedded arithmetic task: determinism, disjoint splits, correct expert solutions,
the verifier on hand-made completions."""

import re
from collections import Counter

import pytest

from policyopt.tasks import TASKS, ArithmeticTask, get_task


def small(**options):
    return ArithmeticTask(**{"train_size": 600, "eval_size": 90, **options})


def test_registered():
    assert "arithmetic" in TASKS
    task = get_task("arithmetic", seed=3, train_size=10, eval_size=5)
    assert isinstance(task, ArithmeticTask)
    assert len(task.rows("train")) == 10 and len(task.rows("eval")) == 5


def test_same_seed_same_rows_other_seed_other_rows():
    a, b, c = small(seed=1), small(seed=1), small(seed=2)
    for split in ("train", "eval"):
        assert a.rows(split).to_dict() == b.rows(split).to_dict()
        assert a.rows(split)["prompt"] != c.rows(split)["prompt"]


def test_splits_disjoint_eval_distinct_and_independent_of_train_size():
    task = small(seed=0)
    train, held = set(task.rows("train")["prompt"]), task.rows("eval")["prompt"]
    assert not train & set(held)
    assert len(set(held)) == len(held) == 90
    assert ArithmeticTask(seed=0, train_size=5, eval_size=90).rows("eval")["prompt"] == held


def test_level_mix_round_robin_and_level_is_number_of_operations():
    task = small(levels=[1, 2, 4])
    rows = task.rows("train")
    assert Counter(rows["level"]) == {1: 200, 2: 200, 4: 200}
    assert rows["level"][:6] == [1, 2, 4, 1, 2, 4]
    for prompt, level in zip(rows["prompt"], rows["level"], strict=True):
        assert len(re.findall(r"[-+*]", prompt)) == level


STEP = re.compile(r"^(\d+)([-+*])(\d+)=(\d+)$")


@pytest.mark.parametrize(
    "options",
    [{}, {"levels": [4], "ops": ["+", "-", "*"]}, {"levels": [1, 3], "operand_range": [0, 5]}],
)
def test_every_expert_solution_is_correct(options):
    task = small(**options)
    lo, hi = task.operand_range
    for split in ("train", "eval"):
        for row in task.rows(split):
            *steps, final = row["solution"].split(". ")
            assert len(steps) == row["level"]
            previous = None
            for sentence in steps:
                sentence = sentence.rstrip(".")
                left, op, right, result = STEP.match(sentence).groups()
                # the step's arithmetic, checked independently by Python
                assert eval(f"{left}{op}{right}") == int(result), sentence
                assert int(result) >= 0
                if previous is not None:
                    assert int(left) == previous  # chained on the last result
                else:
                    assert lo <= int(left) <= hi
                if op == "*":
                    assert 2 <= int(right) <= 5
                else:
                    assert lo <= int(right) <= hi
                previous = int(result)
            assert final == f"A:{previous}"
            assert row["answer"] == str(previous)
            assert eval(row["prompt"].removesuffix("=?")) == previous
            assert task.verify(row["solution"], row) == 1.0
            assert task.expert_solutions(row) == [row["solution"]]


def test_prompt_and_solution_shape_by_hand():
    task = small()
    row = {
        "prompt": "((7+12)-5)+9=?",
        "answer": "23",
        "solution": "7+12=19. 19-5=14. 14+9=23. A:23",
    }
    assert task.format_prompt(row) == "Q:((7+12)-5)+9=?\n"
    assert task.verify(row["solution"], row) == 1.0


@pytest.mark.parametrize(
    ("completion", "answer", "reward", "extracted"),
    [
        ("7+12=19. A:19", "19", 1.0, "19"),
        ("7+12=18. A:18", "19", 0.0, "18"),
        ("A:19", "19", 1.0, "19"),
        ("A: 19\n", "19", 1.0, "19"),
        ("A:5. 5+14=19. A:19", "19", 1.0, "19"),  # the last A: counts
        ("A:19. oops A:20", "19", 0.0, "20"),
        ("A:19 trailing text", "19", 1.0, "19"),
        ("A:019", "19", 1.0, "19"),
        ("A:-4", "-4", 1.0, "-4"),
        ("7+12=19.", "19", None, None),  # no A:
        ("", "19", None, None),
        ("A:19 A:", "19", None, None),  # the last A: has no integer
        ("A:x", "19", None, None),
    ],
)
def test_verifier_by_hand(completion, answer, reward, extracted):
    task = small()
    assert task.verify(completion, {"answer": answer}) == reward
    assert task.extract_answer(completion) == extracted


def test_non_negative_by_construction_even_with_small_values():
    # operand_range starting at 0 and many subtractions: intermediate values may reach 0
    task = ArithmeticTask(
        seed=5, train_size=400, eval_size=0, levels=[4], ops=["-"], operand_range=[0, 3]
    )
    for row in task.rows("train"):
        assert all(int(v) >= 0 for v in re.findall(r"=(\d+)", row["solution"]))


def test_subtraction_from_a_value_below_the_range_becomes_addition():
    task = ArithmeticTask(
        seed=1, train_size=200, eval_size=0, levels=[3], ops=["-"], operand_range=[5, 9]
    )
    solutions = task.rows("train")["solution"]
    # 5..9 minus 5..9 can fall below 5; the next step must then add
    assert any("+" in s for s in solutions)
    for s in solutions:
        for value, op in re.findall(r"(\d+)([-+])\d+=", s):
            assert (op == "+") == (int(value) < 5)


def test_too_few_distinct_problems_is_a_clear_error():
    task = ArithmeticTask(train_size=10, eval_size=50, levels=[1], operand_range=[2, 3])
    with pytest.raises(ValueError, match="too few distinct level-1 problems"):
        task.rows("eval")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"levels": []}, "levels"),
        ({"levels": [0]}, "levels"),
        ({"ops": ["/"]}, "ops"),
        ({"operand_range": [5, 2]}, "operand_range"),
        ({"mul_range": [3]}, "mul_range"),
        ({"train_size": -1}, "sizes"),
        ({"terse_fraction": 1.5}, "terse_fraction"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        ArithmeticTask(**options)


def test_unknown_split():
    with pytest.raises(ValueError, match="unknown split 'test'"):
        small().rows("test")


def test_terse_demonstrations_skip_the_working_and_leave_the_problems_unchanged():
    plain, mixed = small(), small(terse_fraction=0.4)
    for split in ("train", "eval"):
        a, b = plain.rows(split), mixed.rows(split)
        for column in ("prompt", "answer", "solution", "level"):
            assert a[column] == b[column]
        assert set(a["demo_style"]) == {"worked"}
    rows = mixed.rows("train")
    terse = [r for r in rows if r["demo_style"] == "terse"]
    # 600 draws at p = 0.4: the count is within 5 standard deviations (12) of 240.
    assert 180 < len(terse) < 300
    for row in terse[:20]:
        assert mixed.sft_targets(row) == [f"A:{row['answer']}"]
        assert mixed.expert_solutions(row) == [row["solution"]]  # GAR/DATPO anchors unchanged
    worked = next(r for r in rows if r["demo_style"] == "worked")
    assert mixed.sft_targets(worked) == [worked["solution"]]
