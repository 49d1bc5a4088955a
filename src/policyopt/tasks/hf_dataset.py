"""A task read from a JSONL or Parquet file through Hugging Face `datasets`.

Registered as `hf_dataset`; the file format follows the path's suffix (`.jsonl`/`.json`
-> the `json` loader, `.parquet` -> the `parquet` loader). Column names are options and the
columns keep their names, so a TRL reward function written for the file's columns works
unchanged. The eval split is a second file (`eval_path`) or a seeded random fraction of the
train file (`eval_fraction`); with neither, asking for the eval split is an error.

Every row must have a non-empty prompt of at most `MAX_PROMPT_CHARS` characters and, unless
a reward function replaces the exact-match verifier, a non-null answer; a bad row is a
`ValueError` that names the column, the file and the row index (counting from 0). A file
that cannot be read as rows (empty, a line that is not JSON or not an object, bytes that are
not UTF-8, a corrupt Parquet file) is one `ValueError` naming the file and, for JSON, the
line (counting from 1, as editors do), not a parser's traceback.

A prompt may be a list of chat messages (TRL's conversational format, `[{"role": "user",
"content": ...}, ...]`): `prompt_messages` gives them (with `prompt_template` applied to the
last user message), the trainer renders them with the tokenizer's chat template
(`policyopt.train.prompts.encode_prompts`), and reward functions get them as the prompt and
`[{"role": "assistant", "content": ...}]` as the completion, as TRL does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import datasets

from policyopt.rewards.calling import is_conversational
from policyopt.rewards.functions import (
    RewardFunction,
    load_reward_function,
    score_reward_function,
)
from policyopt.tasks.base import TASKS, Task

_LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
ANSWER_MATCHES = ("exact", "last_number")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _same_number(got: str, answer: str) -> bool:
    """Equal as numbers (9 and 9.0), else as text."""
    try:
        return float(got) == float(answer)
    except ValueError:
        return got == answer


# The longest prompt a row may have, in characters: 2^20, about four characters per token
# for 262,144 tokens, beyond the positions of any model this trains. A longer prompt is a
# mistake in the data (a whole document pasted into one row) that would otherwise surface as
# an out-of-memory error, or a silent truncation, in the middle of a run.
MAX_PROMPT_CHARS = 1 << 20


def load_rows(path: str) -> datasets.Dataset:
    """All rows of a JSONL/JSON or Parquet file as one `datasets.Dataset`; a file that has
    no rows or cannot be read is a `ValueError` naming it (and the line, for JSON)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _LOADERS:
        raise ValueError(
            f"{path}: unknown file type {suffix!r}; expected one of {sorted(_LOADERS)}"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    if _LOADERS[suffix] == "json":
        # The json loader's own errors name neither the file nor the line (an empty file is
        # a bare StopIteration): the file is read once here first, to say where it is wrong.
        check_json_rows(path)
    try:
        rows = datasets.load_dataset(
            _LOADERS[suffix], data_files=path, split="train", cache_dir=content_cache(path)
        )
    except Exception as error:  # noqa: BLE001 - the reader's error, in one line
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"{path}: cannot read it as {suffix[1:]} rows ({type(error).__name__}: {reason})"
        ) from None
    if len(rows) == 0:
        raise ValueError(f"{path} has no rows")
    return rows


def content_cache(path: str) -> str:
    """A `datasets` cache folder keyed by the file's bytes (sha256). The library keys its
    cache on the path and modification time only, so a file replaced by one with the same
    time (a copy that keeps times, a checkout, a coarse clock) would be read as the old
    rows; under this folder, other bytes are another cache."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return os.path.join(
        datasets.config.HF_DATASETS_CACHE, "policyopt-by-content", digest.hexdigest()[:24]
    )


def check_json_rows(path: str) -> None:
    """Raise a ValueError naming `path` and the line of the first problem: bytes that are not
    UTF-8, a line that is not JSON, a row that is not a JSON object, or no row at all. A
    `.json` file that starts with `[` is one JSON array of rows; any other is JSON Lines,
    read a line at a time."""
    with open(path, "rb") as f:
        start = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if path.lower().endswith(".json") and start == b"[":
        with open(path, "rb") as f:
            raw = f.read()
        for number, line in enumerate(raw.split(b"\n"), 1):
            _utf8(line, path, number)
        try:
            rows = json.loads(raw.decode("utf-8-sig"))
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} line {error.lineno}: not valid JSON ({error.msg} at column {error.colno})"
            ) from None
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}: row {index} is a JSON {_json_kind(row)}, not an object "
                    "(rows count from 0)"
                )
        if not rows:
            raise ValueError(f"{path} has no rows")
        return
    count = 0
    for number, line in text_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} line {number}: not valid JSON ({error.msg} at column {error.colno})"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{path} line {number}: a JSON {_json_kind(row)}, not an object (JSON "
                'Lines: one {"column": value, ...} object per line)'
            )
        count += 1
    if count == 0:
        raise ValueError(f"{path} has no rows (the file is empty or blank)")


def text_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of a UTF-8 text file, a line at a time, a leading byte-order
    mark dropped. A byte that is not UTF-8 is a ValueError naming the file and the line
    (`_utf8`), not the codec's message, which names neither: the one way the tasks read a
    text data file line by line (JSON Lines here, LETOR files in `tasks.letor`)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            line = _utf8(raw, str(path), number)
            yield number, line.lstrip("\ufeff") if number == 1 else line


def _utf8(raw: bytes, path: str, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} line {number}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column "
            f"{error.start + 1}); save the file as UTF-8"
        ) from None


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def prompt_size(value: Any) -> int:
    """A prompt's length in characters: the text, or the sum of its messages' contents."""
    if is_conversational(value):
        return sum(len(str(m.get("content") or "")) for m in value)
    return len(value) if isinstance(value, str) else len(str(value))


def check_prompt_sizes(rows: datasets.Dataset, column: str, path: str) -> None:
    """Raise a ValueError naming the first row whose prompt is over `MAX_PROMPT_CHARS`."""
    for index, value in enumerate(rows[column]):
        size = prompt_size(value)
        if size > MAX_PROMPT_CHARS:
            raise ValueError(
                f"row {index} of {path}: its {column!r} is {size:,} characters, over the limit "
                f"of {MAX_PROMPT_CHARS:,} (about 4 characters per token for 262,144 tokens, "
                "more than any model's positions; rows count from 0)"
            )


def check_column(rows: datasets.Dataset, column: str, path: str, allow_empty: bool) -> None:
    """Raise a ValueError naming `column`, `path` and the first row that lacks a value
    (missing or null; also an empty string unless `allow_empty`)."""
    columns = ", ".join(rows.column_names)
    if column not in rows.column_names:
        if len(rows) == 0:
            raise ValueError(f"{path} has no {column!r} column (columns: {columns})")
        raise ValueError(f"row 0 of {path} has no {column!r} column (columns: {columns})")
    for index, value in enumerate(rows[column]):
        empty = (isinstance(value, str) and not value.strip()) or (
            isinstance(value, list) and not value
        )
        if value is None or (not allow_empty and empty):
            raise ValueError(
                f"row {index} of {path} has no {column!r} value (missing, null or empty; "
                f"rows count from 0; columns: {columns})"
            )


@TASKS.register("hf_dataset")
class HFDatasetTask(Task):
    """Rows from a file; verifier: exact match after stripping, or `reward_function`.

    `reward_function` is a registered reward-function name, `module.path:function`, or a
    callable with TRL's signature `f(prompts, completions, **columns) -> list[float|None]`;
    it is called with one-element lists (the formatted prompt, the completion, the row).
    `prompt_template` wraps the prompt: `{prompt}` is replaced by the prompt column.
    """

    name = "hf_dataset"

    def __init__(
        self,
        path: str,
        prompt_column: str = "prompt",
        answer_column: str = "answer",
        solution_column: str | None = None,
        eval_path: str | None = None,
        eval_fraction: float | None = None,
        seed: int = 0,
        prompt_template: str = "{prompt}",
        reward_function: str | RewardFunction | None = None,
        answer_match: str = "exact",
    ) -> None:
        """answer_match: how the verifier compares a completion with the answer column
        without a reward function: "exact" (the stripped completion equals the answer) or
        "last_number" (the completion's last number equals the answer's, for models that
        answer in sentences; no number: unparseable)."""
        if answer_match not in ANSWER_MATCHES:
            raise ValueError(
                f"{self.name} task: answer_match must be one of {', '.join(ANSWER_MATCHES)}, "
                f"got {answer_match!r}"
            )
        self.answer_match = answer_match
        if eval_path is not None and eval_fraction is not None:
            raise ValueError(f"{self.name} task: give eval_path or eval_fraction, not both")
        if eval_fraction is not None and not 0.0 < eval_fraction < 1.0:
            raise ValueError(
                f"{self.name} task: eval_fraction must be in (0, 1), got {eval_fraction}"
            )
        if "{prompt}" not in prompt_template:
            raise ValueError(
                f"{self.name} task: prompt_template must contain '{{prompt}}', got {prompt_template!r}"
            )
        self.prompt_column = prompt_column
        self.answer_column = answer_column
        self.solution_column = solution_column
        self.prompt_template = prompt_template
        self.reward_function: RewardFunction | None = (
            load_reward_function(reward_function)
            if isinstance(reward_function, str)
            else reward_function
        )
        self._splits = {"train": self._load(path)}
        if eval_path is not None:
            self._splits["eval"] = self._load(eval_path)
        elif eval_fraction is not None:
            parts = self._splits["train"].train_test_split(test_size=eval_fraction, seed=seed)
            self._splits = {"train": parts["train"], "eval": parts["test"]}

    def _load(self, path: str) -> datasets.Dataset:
        rows = load_rows(path)
        check_column(rows, self.prompt_column, path, allow_empty=False)
        check_prompt_sizes(rows, self.prompt_column, path)
        if self.reward_function is None:
            check_column(rows, self.answer_column, path, allow_empty=True)
        if self.solution_column is not None:
            check_column(rows, self.solution_column, path, allow_empty=True)
        return rows

    def rows(self, split: str) -> datasets.Dataset:
        if split == "eval" and "eval" not in self._splits:
            raise ValueError(f"{self.name} task has no eval split: set eval_path or eval_fraction")
        if split not in ("train", "eval"):
            raise ValueError(f"{self.name} task: unknown split {split!r}; valid: 'train', 'eval'")
        return self._splits[split]

    def format_prompt(self, row: dict[str, Any]) -> str:
        """The prompt as text. A conversational prompt reaches the model through the chat
        template (`prompt_messages`); its text here, one `role: content` line per message,
        is for places without a tokenizer."""
        messages = self.prompt_messages(row)
        if messages is not None:
            return "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        return self._templated(str(row[self.prompt_column]))

    def prompt_messages(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A conversational prompt's messages (copies; `prompt_template` applied to the
        last user message's content), or None for a text prompt."""
        value = row[self.prompt_column]
        if not is_conversational(value):
            return None
        # Arrow gives every message every key any message has (None where absent): dropped,
        # so that chat templates see the messages as written.
        messages = [{k: v for k, v in m.items() if v is not None} for m in value]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if users:
            last = messages[users[-1]]
            last["content"] = self._templated(str(last["content"]))
        return messages

    def _templated(self, prompt: str) -> str:
        # str.replace, not str.format: prompts and templates may hold LaTeX braces.
        return self.prompt_template.replace("{prompt}", prompt)

    def extract_answer(self, completion: str) -> str | None:
        """The whole completion, stripped (exact match has no answer marker), or its last
        number (`answer_match: last_number`; None without one)."""
        if self.answer_match == "last_number":
            found = _NUMBER.findall(completion)
            return found[-1] if found else None
        return completion.strip()

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        if self.reward_function is None:
            answer = str(row[self.answer_column]).strip()
            if self.answer_match == "last_number":
                got = self.extract_answer(completion)
                return None if got is None else float(_same_number(got, answer))
            return 1.0 if completion.strip() == answer else 0.0
        messages = self.prompt_messages(row)
        prompt = self.format_prompt(row) if messages is None else messages
        return _call_one(self.reward_function, prompt, completion, row)


def _call_one(
    fn: Callable[..., Any], prompt: Any, completion: str, row: dict[str, Any]
) -> float | None:
    """A TRL reward function applied to one sample, through the reward pipeline's own call
    path (copies of the row, a named error, a time limit): None or NaN is no reward."""
    columns = {key: [value] for key, value in row.items()}
    return score_reward_function(fn, [prompt], [completion], columns)[0]
