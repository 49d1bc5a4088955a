"""Tasks read from JSONL and Parquet files: columns, splits, validation, verifiers."""

import json

import datasets
import pytest

from policyopt.rewards.functions import RewardFunctionError
from policyopt.tasks import TASKS, HFDatasetTask, get_task

ROWS = [
    {"question": f"{i}+{i}=?", "gold": str(2 * i), "steps": f"{i}+{i}={2 * i}"} for i in range(10)
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def write_parquet(path, rows):
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


OPTIONS = {"prompt_column": "question", "answer_column": "gold"}


@pytest.mark.parametrize("writer", [write_jsonl, write_parquet])
def test_loads_jsonl_and_parquet_with_named_columns(tmp_path, writer):
    suffix = ".jsonl" if writer is write_jsonl else ".parquet"
    path = writer(tmp_path / f"data{suffix}", ROWS)
    task = get_task("hf_dataset", path=path, solution_column="steps", **OPTIONS)
    rows = task.rows("train")
    assert rows["question"] == [r["question"] for r in ROWS]
    row = rows[3]
    assert task.format_prompt(row) == "3+3=?"
    assert task.expert_solutions(row) == ["3+3=6"]
    assert task.verify("  6\n", row) == 1.0
    assert task.verify("7", row) == 0.0
    assert task.extract_answer(" 6 ") == "6"


def test_registered_name():
    assert "hf_dataset" in TASKS


def test_eval_file(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS[:7])
    held = write_parquet(tmp_path / "eval.parquet", ROWS[7:])
    task = HFDatasetTask(train, eval_path=held, **OPTIONS)
    assert len(task.rows("train")) == 7
    assert task.rows("eval")["question"] == ["7+7=?", "8+8=?", "9+9=?"]


def test_eval_fraction_is_seeded_and_disjoint(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", ROWS)
    a = HFDatasetTask(path, eval_fraction=0.3, seed=4, **OPTIONS)
    b = HFDatasetTask(path, eval_fraction=0.3, seed=4, **OPTIONS)
    train, held = list(a.rows("train")["question"]), list(a.rows("eval")["question"])
    assert len(train) == 7 and len(held) == 3
    assert sorted(train + held) == sorted(r["question"] for r in ROWS)
    assert list(b.rows("eval")["question"]) == held
    # other seeds draw other eval rows (not all five can repeat seed 4's three of ten)
    others = [
        HFDatasetTask(path, eval_fraction=0.3, seed=s, **OPTIONS).rows("eval") for s in range(5, 10)
    ]
    assert any(list(rows["question"]) != held for rows in others)


def test_no_eval_split_is_a_clear_error(tmp_path):
    task = HFDatasetTask(write_jsonl(tmp_path / "d.jsonl", ROWS), **OPTIONS)
    with pytest.raises(ValueError, match="no eval split: set eval_path or eval_fraction"):
        task.rows("eval")


def test_missing_prompt_value_names_column_file_and_row(tmp_path):
    rows = [dict(r) for r in ROWS]
    del rows[3]["question"]
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    with pytest.raises(
        ValueError,
        match=r"row 3 of .*data\.jsonl has no 'question' value.*columns: question, gold, steps",
    ):
        HFDatasetTask(path, **OPTIONS)


def test_empty_prompt_in_parquet(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[5]["question"] = "  "
    path = write_parquet(tmp_path / "data.parquet", rows)
    with pytest.raises(ValueError, match=r"row 5 of .*data\.parquet has no 'question' value"):
        HFDatasetTask(path, **OPTIONS)


def test_absent_column_lists_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", ROWS)
    with pytest.raises(
        ValueError,
        match=r"row 0 of .*data\.jsonl has no 'prompt' column \(columns: question, gold, steps\)",
    ):
        HFDatasetTask(path)
    with pytest.raises(ValueError, match="has no 'solution' column"):
        HFDatasetTask(path, solution_column="solution", **OPTIONS)


def test_null_answer_is_an_error_unless_a_reward_function_grades(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[2]["gold"] = None
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    with pytest.raises(ValueError, match="row 2 of .* has no 'gold' value"):
        HFDatasetTask(path, **OPTIONS)
    task = HFDatasetTask(path, reward_function="arithmetic_format", **OPTIONS)
    assert task.verify("so A:4", task.rows("train")[2]) == 1.0


def test_eval_file_is_validated_too(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    held = write_jsonl(
        tmp_path / "held.jsonl",
        [{"question": "1+1=?", "gold": "2"}, {"question": None, "gold": "2"}],
    )
    with pytest.raises(ValueError, match=r"row 1 of .*held\.jsonl has no 'question'"):
        HFDatasetTask(train, eval_path=held, **OPTIONS)


def length_reward(prompts, completions, gold, **columns):
    """A TRL-style reward function, for the module:function spec below."""
    assert set(columns) == {"question", "steps"}
    return [
        None if c == "?" else float(len(c) == len(g))
        for c, g in zip(completions, gold, strict=True)
    ]


def test_pluggable_reward_function_by_spec_and_callable(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", ROWS)
    row = dict(ROWS[6])  # gold "12"
    by_spec = HFDatasetTask(path, reward_function=f"{__name__}:length_reward", **OPTIONS)
    by_callable = HFDatasetTask(path, reward_function=length_reward, **OPTIONS)
    for task in (by_spec, by_callable):
        assert task.verify("99", row) == 1.0
        assert task.verify("999", row) == 0.0
        assert task.verify("?", row) is None


def test_reward_function_returning_two_values_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", ROWS)
    task = HFDatasetTask(path, reward_function=lambda p, c, **k: [1.0, 0.0], **OPTIONS)
    # The pipeline's own error: the reward function is called through its path.
    with pytest.raises(RewardFunctionError, match="returned 2 values for 1 completion"):
        task.verify("x", ROWS[0])


def test_prompt_template_keeps_latex_braces(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "Find \\frac{1}{2}", "answer": "0.5"}])
    task = HFDatasetTask(path, prompt_template="Problem: {prompt}\nAnswer in \\boxed{}.")
    assert (
        task.format_prompt(task.rows("train")[0])
        == "Problem: Find \\frac{1}{2}\nAnswer in \\boxed{}."
    )
    with pytest.raises(ValueError, match="prompt_template must contain"):
        HFDatasetTask(path, prompt_template="no placeholder")


@pytest.mark.parametrize(
    ("name", "options", "error", "message"),
    [
        ("data.csv", {}, ValueError, "unknown file type '.csv'"),
        ("missing.jsonl", {}, FileNotFoundError, "missing.jsonl"),
        ("data.jsonl", {"eval_fraction": 1.5}, ValueError, "eval_fraction"),
        ("data.jsonl", {"eval_fraction": 0.2, "eval_path": "x.jsonl"}, ValueError, "not both"),
    ],
)
def test_bad_paths_and_options(tmp_path, name, options, error, message):
    write_jsonl(tmp_path / "data.jsonl", ROWS)
    (tmp_path / "data.csv").write_text("question,gold\n1,2\n")
    with pytest.raises(error, match=message):
        HFDatasetTask(str(tmp_path / name), **OPTIONS, **options)
