"""Principles 5 and 6 for data files: a file a task cannot use is refused at load with one
short error that names the file and the line or row (and the limit, for a row too large),
never a parser's traceback; a reward that returns something unusable names the function and
the sample. Each case goes through the tasks' one loader (`load_rows`, under `hf_dataset` and
`math`), or for the learning-to-rank files through `read_letor` (under `letor`), which decodes
its lines with the same helper."""

import json

import numpy as np
import pytest

from policyopt.rewards.functions import RewardFunctionError
from policyopt.tasks import HFDatasetTask, LetorTask, MathTask
from policyopt.tasks.hf_dataset import MAX_PROMPT_CHARS

GOOD = [{"prompt": f"{i}+{i}=?", "answer": str(2 * i)} for i in range(5)]


def lines(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def bad_files(tmp_path):
    """(file name, bytes, what the error must say) for each kind of bad file."""
    good = lines(GOOD).encode()
    rows = lines(GOOD).splitlines(keepends=True)
    huge = {"prompt": "x" * (5 << 20), "answer": "1"}
    return [
        ("empty.jsonl", b"", r"empty\.jsonl has no rows"),
        ("blank.jsonl", b"\n  \n", r"blank\.jsonl has no rows"),
        (
            "broken.jsonl",
            "".join([*rows[:2], '{"prompt": "3+3=?", "answer": \n', *rows[3:]]).encode(),
            r"broken\.jsonl line 3: not valid JSON \(Expecting value",
        ),
        (
            "latin1.jsonl",
            good.replace(b"3+3", b"3\xe93"),
            r"latin1\.jsonl line 4: not UTF-8 text \(byte 0xe9 at column \d+\)",
        ),
        ("list.jsonl", rows[0].encode() + b"[1, 2]\n", r"list\.jsonl line 2: a JSON list, not"),
        (
            "huge.jsonl",
            (lines(GOOD[:3]) + json.dumps(huge) + "\n").encode(),
            rf"row 3 of .*huge\.jsonl: its 'prompt' is 5,242,880 characters, over the limit of "
            rf"{MAX_PROMPT_CHARS:,}",
        ),
        ("corrupt.parquet", b"PAR1 not really parquet", r"corrupt\.parquet: cannot read"),
    ]


GOOD_LETOR = b"2 qid:1 1:0.5 3:2\n0 qid:1 2:1.5\n1 qid:7 1:3 # doc \xc3\xa9\n"


def bad_letor_files():
    """(file name, bytes, what the error must say) for each kind of bad LETOR file."""
    return [
        (
            "latin1.letor",
            GOOD_LETOR.replace(b"2:1.5", b"2:1.5 # caf\xe9"),
            r"latin1\.letor line 2: not UTF-8 text \(byte 0xe9 at column 20\)",
        ),
        ("broken.letor", GOOD_LETOR + b"1 q:7 1:2\n", r"broken\.letor:4: not a LETOR line"),
        ("empty.letor", b"# only a comment\n", r"empty\.letor: no data lines"),
    ]


def assert_one_short_line(caught, path) -> None:
    text = str(caught.value)
    assert str(path) in text
    assert "\n" not in text and len(text) < 400, text  # one short line
    # No parser traceback chained under it (the CLI prints the message alone anyway).
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


@pytest.mark.parametrize("case", range(7))
@pytest.mark.parametrize("task_class", [HFDatasetTask, MathTask])
def test_bad_file_is_one_short_error_naming_file_and_line(tmp_path, case, task_class):
    name, content, message = bad_files(tmp_path)[case]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as caught:
        task_class(str(path), prompt_column="prompt")
    assert_one_short_line(caught, path)


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("split", ["train_path", "eval_path"])
def test_bad_letor_file_is_one_short_error_naming_file_and_line(tmp_path, case, split):
    name, content, message = bad_letor_files()[case]
    good, path = tmp_path / "good.letor", tmp_path / name
    good.write_bytes(GOOD_LETOR)  # UTF-8 in a comment is fine
    path.write_bytes(content)
    options = {"train_path": str(good), "eval_path": str(good), split: str(path)}
    with pytest.raises(ValueError, match=message) as caught:
        LetorTask(**options)
    assert_one_short_line(caught, path)


def test_bad_eval_file_is_named_not_the_train_file(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(lines(GOOD))
    held = tmp_path / "held.jsonl"
    held.write_text(lines(GOOD[:1]) + "{oops\n")
    with pytest.raises(ValueError, match=r"held\.jsonl line 2: not valid JSON"):
        HFDatasetTask(str(train), eval_path=str(held))


def test_a_json_array_file_still_loads_and_is_checked_the_same(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(GOOD, indent=1))
    assert len(HFDatasetTask(str(path)).rows("train")) == 5
    path.write_text(json.dumps([*GOOD, 7]))
    with pytest.raises(ValueError, match=r"rows\.json: row 5 is a JSON int, not an object"):
        HFDatasetTask(str(path))


def test_a_prompt_at_the_limit_loads(tmp_path):
    path = tmp_path / "edge.jsonl"
    path.write_text(lines([{"prompt": "x" * MAX_PROMPT_CHARS, "answer": "1"}]))
    assert len(HFDatasetTask(str(path)).rows("train")) == 1


def test_a_long_conversational_prompt_is_measured_by_its_contents(tmp_path):
    half = "x" * (MAX_PROMPT_CHARS // 2 + 1)
    path = tmp_path / "chat.jsonl"
    messages = [{"role": "system", "content": half}, {"role": "user", "content": half}]
    path.write_text(lines([{"prompt": messages, "answer": "1"}]))
    with pytest.raises(ValueError, match=r"row 0 of .*chat\.jsonl: its 'prompt' is 1,048,578"):
        HFDatasetTask(str(path))


def test_reward_returning_a_0d_array_names_function_and_sample(tmp_path):
    def zero_d(prompts, completions, **columns):
        return np.array(1.0)

    path = tmp_path / "d.jsonl"
    path.write_text(lines(GOOD))
    task = HFDatasetTask(str(path), reward_function=zero_d)
    with pytest.raises(RewardFunctionError) as caught:
        task.verify("4", task.rows("train")[2])
    text = str(caught.value)
    assert "reward function 'zero_d' returned a 0-d numpy array" in text
    assert "\n" not in text and len(text) < 300


@pytest.mark.parametrize("case", [0, 2, 3])  # empty, a broken line, a byte that is not UTF-8
def test_policyopt_train_on_a_bad_file_prints_one_line(tmp_path, capsys, case):
    from policyopt.cli.main import main
    from run_configs import small_overrides

    name, content, message = bad_files(tmp_path)[case]
    path = tmp_path / name
    path.write_bytes(content)
    overrides = [
        *small_overrides(tmp_path / "run", 1),
        "task.name=hf_dataset",
        f"task.options={{path: '{path}', eval_path: '{path}'}}",
    ]
    assert main(["train", *overrides]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("policyopt train: error:")]
    assert len(lines) == 1 and str(path) in lines[0], err
    assert "Traceback" not in err
