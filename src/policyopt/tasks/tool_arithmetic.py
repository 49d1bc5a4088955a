"""The embedded tool task: multiplication beyond the tiny model, with a calculator.

A level-k problem (prompt `Q:47*36+18=?`) is

    level 1   a*b      a in 12..99, b in 3..9      (two digits by one)
    level 2   a*b      a, b in 12..99              (two digits by two)
    level 3   a*b+c    a, b, c in 12..99

which a 1 M-parameter character model does not compute reliably in its head. The environment
`calculator` offers one tool, `calc`, that evaluates an arithmetic expression. A
demonstration either calls it, or answers directly:

    tool      calc(47*36+18)</s>=1710\\nA:1710     the model's turn ends at EOS (</s>); the
                                                  environment's reply is `=1710` and a newline
    direct    A:1710

A row's demonstration is a tool call with probability `tool_fraction` (default 0.3, from its
own random stream): the warm start then mostly answers in its head, and wrongly, under greedy
decoding, while about one sample in three calls the tool, which is what RL has to find and
reinforce. The verifier reads the integer after the last `A:` of the episode's text (every
turn and the tool's replies), as the arithmetic task does.

SFT trains on the model's part of a demonstration only: the tool's reply `=1710` and its
newline (the calculator's `Environment.plain_text`, which RL's episodes hold with mask 0) is
an untrained segment (`sft_segments`), read but not predicted, so that the warm start does
not learn to write the tool's results itself.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import datasets

from policyopt.rollout.environment import ENVIRONMENTS
from policyopt.rollout.tool_calls import TOOL_CALL_FORMATS, ToolCall
from policyopt.tasks.base import TASKS, Demonstration, Task
from policyopt.tasks.options import fraction, sizes, split_name
from policyopt.tasks.tool_environment import Tool, ToolEnvironment

LEVELS = (1, 2, 3)
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
MAX_EXPRESSION = 200  # characters: a calculator, not an interpreter
_INTEGER = re.compile(r"\s*(-?\d+)")  # the answer: an integer right after the last "A:"


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with + - * / and parentheses.

    Raises ValueError for anything else (names, calls, powers, text) and ZeroDivisionError
    for a division by zero: the environment shows the error to the model."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


def _evaluate(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ZeroDivisionError("division by zero")
        return Fraction(_OPERATORS[type(node.op)](left, right))
    raise ValueError(f"not an arithmetic expression: {ast.unparse(node)!r}")


@ENVIRONMENTS.register("calculator")
def calculator_environment(call_format: str = "call", timeout_s: float = 1.0) -> ToolEnvironment:
    """The `calc` tool, written as `calc(47*36)` (`call`) or in JSON tags (`hermes`)."""
    return ToolEnvironment([Tool.of(calc)], call_format=call_format, timeout_s=timeout_s)


def make_problem(rng: random.Random, level: int) -> tuple[str, int]:
    """(expression, value) of one level-`level` problem."""
    a = rng.randint(12, 99)
    if level == 1:
        b = rng.randint(3, 9)
        return f"{a}*{b}", a * b
    b = rng.randint(12, 99)
    if level == 2:
        return f"{a}*{b}", a * b
    c = rng.randint(12, 99)
    return f"{a}*{b}+{c}", a * b + c


def tool_style(completion: str) -> str:
    """ "tool" for a completion that calls the calculator first, else "direct"."""
    return "tool" if completion.lstrip().startswith("calc(") else "direct"


@TASKS.register("tool_arithmetic")
class ToolArithmeticTask(Task):
    """Multiplication problems for a model with a calculator (module docstring)."""

    name = "tool_arithmetic"
    eval_group_column = "level"
    styles = ("direct", "tool")
    tools = (Tool.of(calc).schema(),)

    def __init__(
        self,
        seed: int = 0,
        train_size: int = 20000,
        eval_size: int = 300,
        levels: Sequence[int] = LEVELS,
        tool_fraction: float = 0.3,
        turn_end: str = "</s>",
    ) -> None:
        if not levels or any(k not in LEVELS for k in levels):
            raise ValueError(f"tool_arithmetic task: levels must be a subset of {LEVELS}")
        sizes("tool_arithmetic", train_size, eval_size)
        self.tool_fraction = fraction("tool_arithmetic", "tool_fraction", tool_fraction)
        self.seed, self.train_size, self.eval_size = seed, train_size, eval_size
        self.levels = [int(k) for k in levels]
        # The tokenizer's EOS text, which ends the model's turn in a demonstration.
        self.turn_end = turn_end
        self.format = TOOL_CALL_FORMATS.get("call")
        self._splits: dict[str, datasets.Dataset] | None = None

    def rows(self, split: str) -> datasets.Dataset:
        split_name("tool_arithmetic", split)
        if self._splits is None:
            held_out = self._generate("eval", self.eval_size, set())
            train = self._generate("train", self.train_size, set(held_out["prompt"]))
            self._splits = {
                "eval": datasets.Dataset.from_dict(held_out),
                "train": datasets.Dataset.from_dict(train),
            }
        return self._splits[split]

    def _generate(self, split: str, size: int, exclude: set[str]) -> dict[str, list[Any]]:
        """`size` problems of `split` from its own random stream, none in `exclude`, levels
        round robin; the held-out problems are distinct (there are only 616 of level 1), the
        training ones may repeat."""
        rng = random.Random(f"tool_arithmetic-{self.seed}-{split}")
        style_rng = random.Random(f"tool_arithmetic-{self.seed}-{split}-demo")
        out: dict[str, list[Any]] = {k: [] for k in ("prompt", "answer", "level", "demo_style")}
        seen = set(exclude)
        for _ in range(100 * size + 10_000):
            if len(out["prompt"]) == size:
                break
            level = self.levels[len(out["prompt"]) % len(self.levels)]
            expression, value = make_problem(rng, level)
            if expression in seen:
                continue
            if split == "eval":
                seen.add(expression)
            out["prompt"].append(expression)
            out["answer"].append(str(value))
            out["level"].append(level)
            tool = style_rng.random() < self.tool_fraction
            out["demo_style"].append("tool" if tool else "direct")
        if len(out["prompt"]) < size:
            raise ValueError(
                f"tool_arithmetic task: could not draw {size} {split} problems; use a smaller "
                "eval_size (616 distinct level-1 problems exist)"
            )
        return out

    def format_prompt(self, row: dict[str, Any]) -> str:
        """`Q:47*36+18=?\\n`."""
        return f"Q:{row['prompt']}=?\n"

    def tool_demonstration(self, row: dict[str, Any]) -> Demonstration:
        """The call and the turn's end (the model's), the tool's reply as the calculator
        environment writes it (the environment's: untrained), the answer (the model's)."""
        call = self.format.call_text(ToolCall("calc", row["prompt"]))
        # `ToolEnvironment.plain_text` of the reply: the text an episode appends, mask 0.
        reply = self.format.result_text(calc(row["prompt"]))
        return [(f"{call}{self.turn_end}", True), (reply, False), (f"A:{row['answer']}", True)]

    def expert_solutions(self, row: dict[str, Any]) -> list[str]:
        """The tool demonstration's text: the call, the turn's end, the tool's reply, the
        answer."""
        return ["".join(text for text, _ in self.tool_demonstration(row))]

    def sft_targets(self, row: dict[str, Any]) -> list[str]:
        """The row's demonstration: a tool call or the bare answer (module docstring)."""
        if row["demo_style"] == "direct":
            return [f"A:{row['answer']}"]
        return self.expert_solutions(row)

    def sft_segments(self, row: dict[str, Any]) -> list[Demonstration]:
        """`sft_targets` with the tool's reply marked as the environment's (untrained)."""
        if row["demo_style"] == "direct":
            return super().sft_segments(row)
        return [self.tool_demonstration(row)]

    def extract_answer(self, completion: str) -> str | None:
        """The integer right after the last `A:`; None when there is none."""
        start = completion.rfind("A:")
        match = None if start < 0 else _INTEGER.match(completion, start + 2)
        return None if match is None else str(int(match.group(1)))

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        """1.0 if the integer after the last `A:` is the answer, 0.0 if another, None if none."""
        predicted = self.extract_answer(completion)
        if predicted is None:
            return None
        return 1.0 if predicted == str(row["answer"]) else 0.0

    def output_style(self, completion: str, row: dict[str, Any]) -> str:
        return tool_style(completion)
