"""Checks of an embedded task's constructor options, one message format for every task.

Each raises ValueError naming the task, the option and the value it got, so a bad
`task.options` entry in a config fails at load with one line (`policyopt.train.parts`
builds the task there) instead of deep inside data generation.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

SPLITS = ("train", "eval")


def int_pair(task: str, name: str, value: Sequence[int], low: int = 0) -> tuple[int, int]:
    """[lo, hi] with low <= lo <= hi, as a tuple."""
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{task} task: {name} must be two integers [lo, hi], got {value!r}")
    lo, hi = int(value[0]), int(value[1])
    if not low <= lo <= hi:
        raise ValueError(f"{task} task: {name} must satisfy {low} <= lo <= hi, got {value!r}")
    return lo, hi


def subset(task: str, name: str, values: Sequence, allowed: Collection) -> list:
    """A non-empty list drawn from `allowed`."""
    if not values or any(v not in allowed for v in values):
        raise ValueError(
            f"{task} task: {name} must be a non-empty subset of {list(allowed)}, got {values!r}"
        )
    return list(values)


def sizes(task: str, train_size: int, eval_size: int) -> None:
    if train_size < 0 or eval_size < 0:
        raise ValueError(
            f"{task} task: sizes must be >= 0, got train_size={train_size}, eval_size={eval_size}"
        )


def fraction(task: str, name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{task} task: {name} must be in [0, 1], got {value!r}")
    return float(value)


def split_name(task: str, split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"{task} task: unknown split {split!r}; valid: 'train', 'eval'")
