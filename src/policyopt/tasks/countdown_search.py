"""Countdown search traces: a depth-first searcher that writes its search as text.

A state is a list of numbers; a move combines two of them with `+ - * /` into one (the larger
first, so no negative numbers; `-` only when the result is positive, `/` only when exact and
by more than 1). With n numbers the search is n - 1 moves deep, and a leaf is a solution when
its one number is the target. The trace writes one line per move, indented by its depth,
followed by the numbers left (`|4,16`) or, at a leaf, `!` when it hits the target; a new line
at a smaller indent is a backtrack. The trace ends with the answer expression:

    T:19 N:4,7,9          (the prompt)
    9+7=16|4,16
     16+4=20
     16-4=12
     16*4=64
    7*4=28|9,28
     28-9=19!
    A:(7*4)-9

The order in which a node's moves are tried is the search heuristic (`ORDERS`): `closest`
tries the moves whose result is nearest the target first (a good order), `lexical` takes the
pairs left to right and the operators in `+ - * /` order, `random` shuffles them; the last two
are the bad orders that backtrack more.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

ORDERS = ("closest", "lexical", "random")
OPERATORS = ("+", "-", "*", "/")


@dataclass(frozen=True)
class Move:
    a: int
    op: str
    b: int
    value: int
    rest: tuple[tuple[int, str], ...]  # the state after the move: (value, expression) pairs


@dataclass(frozen=True)
class Trace:
    text: str  # the whole response: search lines, then `A:<expression>`
    expression: str | None  # the solution found; None if the search failed or ran out
    lines: int  # search lines written


def _combine(a: int, op: str, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a > b else None
    if op == "*":
        return a * b
    return a // b if b > 1 and a % b == 0 else None


def moves(
    state: tuple[tuple[int, str], ...], operators: tuple[str, ...], max_value: int | None = None
) -> list[Move]:
    """Every move from `state`, pairs left to right, operators in the given order; with
    `max_value`, moves whose result is larger are not made (a smaller search, fewer facts)."""
    out = []
    for i in range(len(state)):
        for j in range(i + 1, len(state)):
            (x, ex), (y, ey) = state[i], state[j]
            (a, ea), (b, eb) = ((x, ex), (y, ey)) if x >= y else ((y, ey), (x, ex))
            rest = tuple(s for k, s in enumerate(state) if k not in (i, j))
            for op in operators:
                value = _combine(a, op, b)
                if value is not None and (max_value is None or value <= max_value):
                    out.append(Move(a, op, b, value, (*rest, (value, f"({ea}{op}{eb})"))))
    return out


def _orderer(order: str, target: int, rng: random.Random) -> Callable[[list[Move]], list[Move]]:
    if order == "closest":
        return lambda ms: sorted(ms, key=lambda m: abs(m.value - target))
    if order == "lexical":
        return lambda ms: ms
    if order == "random":
        return lambda ms: rng.sample(ms, len(ms))
    raise ValueError(f"countdown search: unknown order {order!r}; valid: {', '.join(ORDERS)}")


def search(
    numbers: list[int],
    target: int,
    order: str = "closest",
    *,
    seed: int = 0,
    max_lines: int = 200,
    max_chars: int | None = None,
    operators: tuple[str, ...] = OPERATORS,
    max_value: int | None = None,
) -> Trace:
    """Depth-first search for an expression over all `numbers` equal to `target`, written as
    a trace (module doc). Stops at the first solution, or after `max_lines` moves or once the
    lines pass `max_chars` characters (then the trace ends with `A:none` and `expression` is
    None)."""
    if len(numbers) < 2:
        raise ValueError(f"countdown search: needs at least 2 numbers, got {numbers!r}")
    ordered = _orderer(order, target, random.Random(seed))
    lines: list[str] = []
    size = [0]  # characters written so far

    def visit(state: tuple[tuple[int, str], ...], depth: int) -> str | None:
        for move in ordered(moves(state, operators, max_value)):
            if len(lines) >= max_lines or (max_chars is not None and size[0] > max_chars):
                return None
            line = " " * depth + f"{move.a}{move.op}{move.b}={move.value}"
            size[0] += len(line) + 1
            if len(move.rest) > 1:
                lines.append(line + "|" + ",".join(str(v) for v, _ in move.rest))
                found = visit(move.rest, depth + 1)
                if found is not None:
                    return found
            elif move.value == target:
                lines.append(line + "!")
                return move.rest[0][1]
            else:
                lines.append(line)
        return None

    found = visit(tuple((n, str(n)) for n in numbers), 0)
    expression = None if found is None else _strip_outer(found)
    answer = "A:" + (expression if expression is not None else "none")
    return Trace("\n".join([*lines, answer]), expression, len(lines))


def _strip_outer(expression: str) -> str:
    """`(a+b)` -> `a+b` when the outer parentheses enclose the whole expression."""
    if not (expression.startswith("(") and expression.endswith(")")):
        return expression
    depth = 0
    for i, c in enumerate(expression):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and i < len(expression) - 1:
            return expression
    return expression[1:-1]
