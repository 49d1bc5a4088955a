"""Countdown with search traces: an embedded long-reasoning task (as in "Stream of Search",
Gandhi et al. 2024).

Given 3 or 4 numbers and a target, find an expression that uses every number exactly once
with `+ - * /` and equals the target:

    prompt    T:19 N:4,7,9
    response  a depth-first search in text (`countdown_search`), ending in `A:(7*4)-9`

The verifier parses and evaluates the expression after the last `A:` exactly (no `eval`,
`countdown_expr`). Problems are solvable by construction: the numbers are drawn, then random
moves combine them down to one number, the target.

Demonstrations for SFT come from the searcher under several search orders (`demo_orders`,
e.g. the good `closest` order and the bad `lexical` and `random` ones, which backtrack
more), so the warm start mixes strategies and RL has a real choice: with a bounded response
length the bad orders run out of room more often. A demonstration longer than
`max_trace_chars` is replaced by the `closest` trace (recorded in `demo_style`). The expert
solution (GAR's anchor) is the shortest trace over all orders.

Levels: 1 = three numbers; 2 = four numbers; 3 = four numbers whose `closest` search needs at
least `hard_lines` moves (more backtracking). Numbers are drawn from `number_range`, targets
are kept in `target_range`, and every problem's `closest` trace fits in `max_trace_chars`.
With `max_value`, no move makes a number above it (the searcher's and the generator's): a
smaller search over fewer arithmetic facts, which a small model learns faster.
Splits and level mix follow the arithmetic task: the eval split is drawn first from its own
stream, the train split skips its prompts, levels are assigned round robin.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import datasets

from policyopt.tasks.base import TASKS, Task
from policyopt.tasks.countdown_expr import score
from policyopt.tasks.countdown_search import ORDERS, Trace, moves, search
from policyopt.tasks.options import int_pair, sizes, split_name, subset

LEVEL_NUMBERS = {1: 3, 2: 4, 3: 4}
_FIRST_MOVE = re.compile(r"^(\d+)([-+*/])(\d+)=(\d+)")


def draw_problem(
    rng: random.Random,
    count: int,
    number_range: tuple[int, int],
    target_range: tuple[int, int],
    max_value: int | None = None,
) -> tuple[list[int], int]:
    """`count` numbers and a target reached by random moves (so solvable) in `target_range`."""
    for _ in range(10_000):
        numbers = [rng.randint(*number_range) for _ in range(count)]
        state = tuple((n, str(n)) for n in numbers)
        while len(state) > 1:
            options = moves(state, ("+", "-", "*", "/"), max_value)
            if not options:
                break
            state = rng.choice(options).rest
        if len(state) > 1:
            continue
        if target_range[0] <= state[0][0] <= target_range[1]:
            return numbers, state[0][0]
    raise ValueError(
        f"countdown task: no target in {target_range} from {count} numbers in {number_range}"
    )


def answer_expression(completion: str) -> str | None:
    """The text after the last `A:` up to the end of its line; None if there is no `A:`."""
    start = completion.rfind("A:")
    if start < 0:
        return None
    return completion[start + 2 :].split("\n", 1)[0].strip()


@TASKS.register("countdown")
class CountdownTask(Task):
    """Countdown problems with search-trace demonstrations; see the module doc."""

    name = "countdown"
    prompt_column = "prompt"
    answer_column = "answer"
    solution_column = "solution"
    eval_group_column = "level"
    styles = ("closest", "other")

    def __init__(
        self,
        seed: int = 0,
        train_size: int = 10000,
        eval_size: int = 300,
        levels: Sequence[int] = (2, 3),
        number_range: Sequence[int] = (1, 9),
        target_range: Sequence[int] = (1, 100),
        demo_orders: Mapping[str, float] | None = None,
        max_trace_chars: int = 400,
        hard_lines: int = 10,
        max_value: int | None = None,
    ) -> None:
        self.levels = [int(k) for k in subset("countdown", "levels", levels, LEVEL_NUMBERS)]
        sizes("countdown", train_size, eval_size)
        orders = dict(demo_orders or {"closest": 0.4, "lexical": 0.3, "random": 0.3})
        bad = [o for o in orders if o not in ORDERS]
        if bad or not orders or any(w < 0 for w in orders.values()) or sum(orders.values()) <= 0:
            raise ValueError(
                f"countdown task: demo_orders must map some of {ORDERS} to weights >= 0 with a "
                f"positive sum, got {demo_orders!r}"
            )
        if max_trace_chars < 20 or hard_lines < 1:
            raise ValueError(
                f"countdown task: max_trace_chars must be >= 20 and hard_lines >= 1, got "
                f"{max_trace_chars} and {hard_lines}"
            )
        self.seed = seed
        self.train_size = train_size
        self.eval_size = eval_size
        self.number_range = int_pair("countdown", "number_range", number_range, 1)
        self.target_range = int_pair("countdown", "target_range", target_range, 1)
        self.demo_orders = orders
        self.max_trace_chars = int(max_trace_chars)
        self.hard_lines = int(hard_lines)
        if max_value is not None and max_value < self.target_range[1]:
            raise ValueError(
                f"countdown task: max_value ({max_value}) must be >= the largest target "
                f"({self.target_range[1]}) or null"
            )
        self.max_value = max_value
        self._splits: dict[str, datasets.Dataset] | None = None

    def rows(self, split: str) -> datasets.Dataset:
        split_name("countdown", split)
        if self._splits is None:
            eval_rows = self._generate("eval", self.eval_size, exclude=None)
            train_rows = self._generate("train", self.train_size, exclude=set(eval_rows["prompt"]))
            self._splits = {
                "eval": datasets.Dataset.from_dict(eval_rows),
                "train": datasets.Dataset.from_dict(train_rows),
            }
        return self._splits[split]

    def _search(self, numbers: list[int], target: int, order: str, seed: int) -> Trace:
        return search(
            numbers,
            target,
            order,
            seed=seed,
            max_chars=self.max_trace_chars,
            max_value=self.max_value,
        )

    def _fits(self, trace: Trace) -> bool:
        return trace.expression is not None and len(trace.text) <= self.max_trace_chars

    def _generate(self, split: str, size: int, exclude: set[str] | None) -> dict[str, list]:
        rng = random.Random(f"countdown-{self.seed}-{split}")
        demo_rng = random.Random(f"countdown-{self.seed}-{split}-demo")
        names, weights = list(self.demo_orders), list(self.demo_orders.values())
        seen: set[str] = set() if exclude is None else exclude
        columns = ("prompt", "numbers", "target", "answer", "solution", "demo", "demo_style")
        out: dict[str, list] = {k: [] for k in (*columns, "level")}
        tries = 0
        while len(out["prompt"]) < size:
            level = self.levels[len(out["prompt"]) % len(self.levels)]
            tries += 1
            if tries > 200 * size + 10_000:
                raise ValueError(
                    f"countdown task: could not draw {size} {split} problems "
                    f"({len(out['prompt'])} after {tries} draws): widen number_range or "
                    f"target_range, or raise max_trace_chars"
                )
            numbers, target = draw_problem(
                rng, LEVEL_NUMBERS[level], self.number_range, self.target_range, self.max_value
            )
            prompt = f"T:{target} N:{','.join(map(str, numbers))}"
            closest = self._search(numbers, target, "closest", 0)
            if prompt in seen or not self._fits(closest):
                continue
            if level == 3 and closest.lines < self.hard_lines:
                continue
            if exclude is None:
                seen.add(prompt)
            traces = {o: self._search(numbers, target, o, tries) for o in ORDERS}
            fitting = [t for t in traces.values() if self._fits(t)]
            style = demo_rng.choices(names, weights)[0]
            demo = traces[style] if self._fits(traces[style]) else closest
            expert = min(fitting, key=lambda t: len(t.text))
            out["prompt"].append(prompt)
            out["numbers"].append(numbers)
            out["target"].append(target)
            out["answer"].append(expert.expression)
            out["solution"].append(expert.text)
            out["demo"].append(demo.text)
            out["demo_style"].append(style if demo is traces[style] else "closest")
            out["level"].append(level)
        return out

    def format_prompt(self, row: dict[str, Any]) -> str:
        """`T:19 N:4,7,9\\n`: the model continues with its search, then EOS."""
        return f"{row[self.prompt_column]}\n"

    def sft_targets(self, row: dict[str, Any]) -> list[str]:
        """The row's demonstration: a search trace in the row's `demo_style` order."""
        return [row["demo"]]

    def extract_answer(self, completion: str) -> str | None:
        """The answer expression without spaces (for maj@k and distinct answers)."""
        expression = answer_expression(completion)
        return None if not expression else expression.replace(" ", "")

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        """1.0 for an expression over all the numbers, each once, equal to the target; 0.0
        for a wrong one (or `A:none`, the search giving up); None if there is no `A:` or the
        expression is malformed."""
        expression = answer_expression(completion)
        if expression is None:
            return None
        if expression == "none":
            return 0.0
        return score(expression, list(row["numbers"]), int(row["target"]))

    def output_style(self, completion: str, row: dict[str, Any]) -> str:
        """ "closest" when the first move tried is one the `closest` order tries first (its
        result nearest the target), else "other"."""
        match = _FIRST_MOVE.match(completion.lstrip("\n"))
        if match is None:
            return "other"
        state = tuple((n, str(n)) for n in row["numbers"])
        target = int(row["target"])
        best = min(
            abs(m.value - target) for m in moves(state, ("+", "-", "*", "/"), self.max_value)
        )
        return "closest" if abs(int(match.group(4)) - target) == best else "other"
