"""The embedded task: synthetic multi-step arithmetic with expert step-by-step solutions.

A level-k problem chains k operations, innermost first, each bracketed:

    prompt    ((7+12)-5)+9=?
    solution  7+12=19. 19-5=14. 14+9=23. A:23
    answer    23

Every intermediate value is non-negative by construction: a subtraction never takes away
more than the running value (its operand is drawn from [lo, value]); when the running
value is below the smallest operand, the step becomes an addition instead. Multiplication
(`ops` containing "*") uses small operands (`mul_range`, default 2..5) and is the harder
option.

The eval split is drawn first from its own random stream and holds distinct prompts; the
train split is drawn from another stream and skips every eval prompt, so no prompt appears
in both, and the eval split does not change with `train_size`. Levels are assigned round
robin (`levels[i % len(levels)]`), so every prefix of a split has the same level mix.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import datasets

from policyopt.rewards.calling import completion_text
from policyopt.rewards.functions import REWARD_FUNCTIONS
from policyopt.tasks.base import TASKS, Task
from policyopt.tasks.options import fraction, int_pair, sizes, split_name, subset

# The final answer: an integer right after the last "A:" of a completion.
_INTEGER = re.compile(r"\s*(-?\d+)")
_ENDS_WITH_ANSWER = re.compile(r"A:-?\d+\s*$")


@REWARD_FUNCTIONS.register("arithmetic_format")
def arithmetic_format_reward(
    prompts: list[str], completions: list[str], **columns: Any
) -> list[float]:
    """1.0 if the completion ends with `A:<int>` (trailing whitespace allowed), else 0.0:
    the arithmetic task's answer format."""
    texts = map(completion_text, completions)
    return [1.0 if _ENDS_WITH_ANSWER.search(c) else 0.0 for c in texts]


_OPS = ("+", "-", "*")


def make_problem(
    rng: random.Random,
    level: int,
    ops: Sequence[str],
    operand_range: tuple[int, int],
    mul_range: tuple[int, int],
) -> tuple[str, str, str]:
    """One level-`level` problem: (prompt, solution, answer), all intermediate values >= 0."""
    lo, hi = operand_range
    value = rng.randint(lo, hi)
    expr = str(value)
    steps = []
    for step in range(level):
        op = rng.choice(ops)
        if op == "-" and value < lo:
            op = "+"  # nothing in [lo, value] to subtract: keep the result non-negative
        if op == "*":
            operand = rng.randint(*mul_range)
            new = value * operand
        elif op == "-":
            operand = rng.randint(lo, min(hi, value))
            new = value - operand
        else:
            operand = rng.randint(lo, hi)
            new = value + operand
        steps.append(f"{value}{op}{operand}={new}.")
        expr = f"({expr}){op}{operand}" if step > 0 else f"{expr}{op}{operand}"
        value = new
    return f"{expr}=?", " ".join(steps) + f" A:{value}", str(value)


def solution_style(completion: str) -> str:
    """ "terse" for a completion that states the answer without working (`A:23`), else
    "worked"."""
    return "terse" if completion.lstrip().startswith("A:") else "worked"


@TASKS.register("arithmetic")
class ArithmeticTask(Task):
    """Multi-step +/- (optionally *) problems with expert solutions; see the module doc."""

    name = "arithmetic"
    prompt_column = "prompt"
    answer_column = "answer"
    solution_column = "solution"
    eval_group_column = "level"
    styles = ("terse", "worked")

    def __init__(
        self,
        seed: int = 0,
        train_size: int = 20000,
        eval_size: int = 500,
        levels: Sequence[int] = (1, 2, 3),
        operand_range: Sequence[int] = (2, 19),
        ops: Sequence[str] = ("+", "-"),
        mul_range: Sequence[int] = (2, 5),
        terse_fraction: float = 0.0,
    ) -> None:
        if not levels or not all(isinstance(k, int) and k >= 1 for k in levels):
            raise ValueError(f"arithmetic task: levels must be integers >= 1, got {levels!r}")
        self.ops = tuple(subset("arithmetic", "ops", ops, _OPS))
        sizes("arithmetic", train_size, eval_size)
        self.terse_fraction = fraction("arithmetic", "terse_fraction", terse_fraction)
        self.seed = seed
        self.train_size = train_size
        self.eval_size = eval_size
        self.levels = [int(k) for k in levels]
        self.operand_range = int_pair("arithmetic", "operand_range", operand_range)
        self.mul_range = int_pair("arithmetic", "mul_range", mul_range)
        self._splits: dict[str, datasets.Dataset] | None = None

    def rows(self, split: str) -> datasets.Dataset:
        split_name("arithmetic", split)
        if self._splits is None:
            eval_rows = self._generate("eval", self.eval_size, exclude=None)
            exclude = set(eval_rows["prompt"])
            train_rows = self._generate("train", self.train_size, exclude=exclude)
            self._splits = {
                "eval": datasets.Dataset.from_dict(eval_rows),
                "train": datasets.Dataset.from_dict(train_rows),
            }
        return self._splits[split]

    def _generate(self, split: str, size: int, exclude: set[str] | None) -> dict[str, list]:
        """`size` rows of `split` from its own random stream. With `exclude` None the prompts
        are distinct (the eval split); otherwise prompts in `exclude` are skipped (train)."""
        # A str seed is hashed with SHA-512, not Python's salted hash: same rows on every run.
        rng = random.Random(f"arithmetic-{self.seed}-{split}")
        # Its own stream, so that the problems do not depend on terse_fraction.
        style_rng = random.Random(f"arithmetic-{self.seed}-{split}-demo")
        seen: set[str] = set() if exclude is None else exclude
        out: dict[str, list] = {
            "prompt": [],
            "answer": [],
            "solution": [],
            "level": [],
            "demo_style": [],
        }
        max_tries = 100 * size + 10_000
        tries = 0
        while len(out["prompt"]) < size:
            level = self.levels[len(out["prompt"]) % len(self.levels)]
            prompt, solution, answer = make_problem(
                rng, level, self.ops, self.operand_range, self.mul_range
            )
            tries += 1
            if prompt in seen:
                if tries > max_tries:
                    raise ValueError(
                        f"arithmetic task: could not draw {size} {split} problems "
                        f"({len(out['prompt'])} after {tries} draws); there are too few distinct "
                        f"level-{level} problems for operand_range {self.operand_range}: use a "
                        f"smaller eval_size or a wider operand_range"
                    )
                continue
            if exclude is None:
                seen.add(prompt)
            out["prompt"].append(prompt)
            out["solution"].append(solution)
            out["answer"].append(answer)
            out["level"].append(level)
            terse = style_rng.random() < self.terse_fraction
            out["demo_style"].append("terse" if terse else "worked")
        return out

    def sft_targets(self, row: dict[str, Any]) -> list[str]:
        """The expert solution, or for a `terse` row the bare answer `A:23`: demonstrations
        that skip the working (see `terse_fraction` in the module doc)."""
        if row.get("demo_style") == "terse":
            return [f"A:{row[self.answer_column]}"]
        return self.expert_solutions(row)

    def output_style(self, completion: str, row: dict[str, Any]) -> str:
        """ "terse" or "worked" (`solution_style`)."""
        return solution_style(completion)

    def format_prompt(self, row: dict[str, Any]) -> str:
        """`Q:((7+12)-5)+9=?\\n`: the model continues with the solution, then EOS."""
        return f"Q:{row[self.prompt_column]}\n"

    def extract_answer(self, completion: str) -> str | None:
        """The integer right after the last `A:`; None when there is no `A:` or no integer
        follows the last one."""
        start = completion.rfind("A:")
        if start < 0:
            return None
        match = _INTEGER.match(completion, start + 2)
        return None if match is None else str(int(match.group(1)))

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        """1.0 if the last `A:<int>` equals the answer, 0.0 if not, None if unparseable."""
        predicted = self.extract_answer(completion)
        if predicted is None:
            return None
        return 1.0 if predicted == str(row[self.answer_column]).strip() else 0.0
