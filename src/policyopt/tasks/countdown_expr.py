"""Countdown answers: a safe parser and exact evaluator for `+ - * /` expressions.

No `eval`: the text is tokenised into integers, the four operators and parentheses, parsed by
recursive descent with the usual precedence (`*` and `/` before `+` and `-`, left to right),
and evaluated in exact fractions, so `(3/2)*4` is 6 and `7/2` is not an integer. A unary minus
is allowed (`-9+4*7`, as sympy prints expressions); decimals, `**`, names and anything else
are rejected as malformed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")
MAX_LENGTH = 200  # characters; a longer "expression" is malformed, not evaluated


class MalformedExpression(ValueError):
    """The text is not an expression over integers with + - * / and parentheses."""


@dataclass(frozen=True)
class Evaluated:
    value: Fraction
    numbers: tuple[int, ...]  # the integer literals, in the order they appear


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise MalformedExpression(f"unexpected character {text[pos]!r} at {pos} in {text!r}")
        out.append(match.group(1) or match.group(2))
        pos = match.end()
    return out


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise MalformedExpression("the expression ends early")
        self.pos += 1
        return token

    def expression(self) -> Fraction:  # expression := term (('+'|'-') term)*
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.term()
            value = value + right if op == "+" else value - right
        return value

    def term(self) -> Fraction:  # term := factor (('*'|'/') factor)*
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.factor()
            if op == "*":
                value = value * right
            elif right == 0:
                raise ZeroDivisionError("division by zero in the expression")
            else:
                value = value / right
        return value

    def factor(self) -> Fraction:  # factor := '-' factor | integer | '(' expression ')'
        token = self.take()
        if token == "-":
            return -self.factor()
        if token == "(":
            value = self.expression()
            if self.take() != ")":
                raise MalformedExpression("a parenthesis is not closed")
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise MalformedExpression(f"expected a number or '(', got {token!r}")


def evaluate(text: str) -> Evaluated:
    """The exact value of `text` and the integers it uses. Raises `MalformedExpression` for
    text that is not such an expression and `ZeroDivisionError` for a division by zero."""
    if len(text) > MAX_LENGTH:
        raise MalformedExpression(f"expression longer than {MAX_LENGTH} characters")
    tokens = _tokens(text)
    if not tokens:
        raise MalformedExpression("empty expression")
    parser = _Parser(tokens)
    value = parser.expression()
    if parser.pos != len(tokens):
        raise MalformedExpression(f"unexpected {tokens[parser.pos]!r} after the expression")
    return Evaluated(value, tuple(parser.numbers))


def score(expression: str, numbers: list[int], target: int) -> float | None:
    """1.0 if `expression` uses each of `numbers` exactly once (all of them) and equals
    `target`; 0.0 if it is well formed but wrong (other numbers, a number reused or left out,
    another value, a division by zero); None if it is malformed."""
    try:
        result = evaluate(expression)
    except MalformedExpression:
        return None
    except ZeroDivisionError:
        return 0.0
    if sorted(result.numbers) != sorted(numbers):
        return 0.0
    return 1.0 if result.value == target else 0.0
