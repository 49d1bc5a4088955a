"""A task read from a JSONL or Parquet file through Hugging Face `datasets`.

Registered as `hf_dataset`; the file format follows the path's suffix (`.jsonl`/`.json`
-> the `json` loader, `.parquet` -> the `parquet` loader). Column names are options and the
columns keep their names, so a TRL reward function written for the file's columns works
unchanged. The eval split is a second file (`eval_path`) or a seeded random fraction of the
train file (`eval_fraction`); with neither, asking for the eval split is an error.

Every row must have a non-empty prompt and, unless a reward function replaces the
exact-match verifier, a non-null answer; a bad row is a `ValueError` that names the column,
the file and the row index (counting from 0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import datasets

from policyopt.rewards.functions import (
    RewardFunction,
    call_reward_function,
    load_reward_function,
)
from policyopt.tasks.base import TASKS, Task

_LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_rows(path: str) -> datasets.Dataset:
    """All rows of a JSONL/JSON or Parquet file as one `datasets.Dataset`."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _LOADERS:
        raise ValueError(
            f"{path}: unknown file type {suffix!r}; expected one of {sorted(_LOADERS)}"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    return datasets.load_dataset(_LOADERS[suffix], data_files=path, split="train")


def check_column(rows: datasets.Dataset, column: str, path: str, allow_empty: bool) -> None:
    """Raise a ValueError naming `column`, `path` and the first row that lacks a value
    (missing or null; also an empty string unless `allow_empty`)."""
    columns = ", ".join(rows.column_names)
    if column not in rows.column_names:
        if len(rows) == 0:
            raise ValueError(f"{path} has no {column!r} column (columns: {columns})")
        raise ValueError(f"row 0 of {path} has no {column!r} column (columns: {columns})")
    for index, value in enumerate(rows[column]):
        if value is None or (not allow_empty and isinstance(value, str) and not value.strip()):
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
    ) -> None:
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
        # str.replace, not str.format: prompts and templates may hold LaTeX braces.
        return self.prompt_template.replace("{prompt}", str(row[self.prompt_column]))

    def extract_answer(self, completion: str) -> str | None:
        """The whole completion, stripped (exact-match tasks have no answer marker)."""
        return completion.strip()

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        if self.reward_function is None:
            return 1.0 if completion.strip() == str(row[self.answer_column]).strip() else 0.0
        return _call_one(self.reward_function, self.format_prompt(row), completion, row)


def _call_one(
    fn: Callable[..., Any], prompt: str, completion: str, row: dict[str, Any]
) -> float | None:
    """A TRL reward function applied to one sample."""
    columns = {key: [value] for key, value in row.items()}
    values = list(call_reward_function(fn, [prompt], [completion], **columns))
    if len(values) != 1:
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(f"reward function {name!r} returned {len(values)} values for 1 completion")
    value = None if values[0] is None else float(values[0])
    return None if value is None or math.isnan(value) else value  # NaN: no reward, as None
