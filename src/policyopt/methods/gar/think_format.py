"""The GAR authors' reward post-processing, as pure functions on text and token counts.

A response has the strict format when, after dropping trailing special tokens (`<|...|>`,
other than the tags themselves) and whitespace, it reads

    <think-open> THINK <think-close> <answer-open> ANSWER <answer-close>

with only whitespace before, between and after the tagged parts, and each tag once (the
authors' rule, with their tags `<|think|>`, `<|/think|>`, `<answer>`, `</answer>` by default;
THINK or ANSWER may be empty). Their post-processing then adds, per rollout:

    format term       valid → format_bonus; invalid → invalid_format_penalty
    think term        valid → p(n), n = tokens of THINK; invalid → 0
    p(n) = P                              n <= hard
         = P · (target − n)/(target − hard)   hard < n < target
         = 0                              n >= target
    target = clamp(round(ρ_t · a), lo, hi),  hard = clamp(round(ρ_h · target), 1, target)

with a the anchor's think length in tokens (its tagged think part, else all of it), and
(hard, target) = the fallback pair when there is no anchor or the thresholds are not relative.
`round` is Python's (half to even), as in the authors' code. Defaults: defaults.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policyopt.methods.gar.defaults import (
    THINK_FALLBACK,
    THINK_HARD_RATIO,
    THINK_PENALTY,
    THINK_RELATIVE,
    THINK_TARGET_RANGE,
    THINK_TARGET_RATIO,
)


@dataclass(frozen=True)
class StrictFormat:
    """Character ranges [start, end) of THINK and ANSWER in the parsed text."""

    think: tuple[int, int]
    answer: tuple[int, int]


def trailing_end(text: str, keep: Sequence[str] = ()) -> int:
    """Where `text` ends once trailing whitespace and special tokens are dropped: a special
    token is `<|x|>` with a non-empty x free of `<`, `>` and `|`, and not one of `keep`."""
    end = len(text)
    while True:
        while end > 0 and text[end - 1].isspace():
            end -= 1
        if end < 4 or text[end - 2 : end] != "|>":
            return end
        start = text.rfind("<|", 0, end - 2)
        inner = text[start + 2 : end - 2]
        if start < 0 or text[start:end] in keep or not inner or any(c in "<>|" for c in inner):
            return end
        end = start


def _once_after(text: str, tag: str, start: int) -> int:
    """Index of the first `tag` at or after `start`; -1 when absent or when it occurs again
    after that."""
    at = text.find(tag, start)
    if at < 0 or text.find(tag, at + 1) >= 0:
        return -1
    return at


def parse_strict(text: str, tags: Sequence[str]) -> StrictFormat | None:
    """THINK and ANSWER of a strict-format response (module docstring); None otherwise.
    `tags` = (think open, think close, answer open, answer close)."""
    t_open, t_close, a_open, a_close = tags
    end = trailing_end(text, keep=tags)
    body = text[:end]
    p0 = _once_after(body, t_open, 0)
    p1 = -1 if p0 < 0 else _once_after(body, t_close, p0 + len(t_open))
    p2 = -1 if p1 < 0 else _once_after(body, a_open, p1 + len(t_close))
    p3 = -1 if p2 < 0 else _once_after(body, a_close, p2 + len(a_open))
    if p3 < 0:
        return None
    outside = (body[:p0], body[p1 + len(t_close) : p2], body[p3 + len(a_close) :])
    if any(part.strip() for part in outside):
        return None
    return StrictFormat(think=(p0 + len(t_open), p1), answer=(p2 + len(a_open), p3))


def anchor_think_text(text: str, think_open: str, think_close: str) -> str:
    """The part of an anchor that GAR's think span compares with: the text between its one
    pair of think tags if it has exactly one, else the whole anchor without trailing special
    tokens; stripped of surrounding whitespace."""
    tags = (think_open, think_close)
    body = text[: trailing_end(text, keep=tags)]
    start = _once_after(body, think_open, 0)
    close = -1 if start < 0 else _once_after(body, think_close, start + len(think_open))
    if close < 0:
        return body.strip()
    return body[start + len(think_open) : close].strip()


def think_thresholds(
    anchor_tokens: int,
    relative: bool = THINK_RELATIVE,
    target_ratio: float = THINK_TARGET_RATIO,
    target_range: tuple[int, int] = THINK_TARGET_RANGE,
    hard_ratio: float = THINK_HARD_RATIO,
    fallback: tuple[int, int] = THINK_FALLBACK,
) -> tuple[int, int]:
    """(hard, target) in tokens: target = clamp(round(ρ_t · a), lo, hi), hard = clamp(
    round(ρ_h · target), 1, target) for an anchor of a > 0 think tokens; `fallback` when
    a <= 0 or not `relative`."""
    if not relative or anchor_tokens <= 0:
        return int(fallback[0]), int(fallback[1])
    lo, hi = target_range
    target = min(max(round(anchor_tokens * target_ratio), lo), hi)
    hard = min(target, max(1, round(target * hard_ratio)))
    return int(hard), int(target)


def think_length_penalty(
    n_tokens: int, hard: int, target: int, max_penalty: float = THINK_PENALTY
) -> float:
    """p(n): `max_penalty` at n <= hard, 0 at n >= target, linear in between."""
    if n_tokens <= hard:
        return float(max_penalty)
    if n_tokens >= target:
        return 0.0
    return float(max_penalty) * (target - n_tokens) / (target - hard)


def check_think_options(
    max_penalty: float,
    target_ratio: float,
    target_range: Sequence[int],
    hard_ratio: float,
    fallback: Sequence[int],
) -> None:
    """The authors' checks on the think-length options (ValueError naming the option)."""
    lo, hi = target_range
    hard, target = fallback
    if max_penalty > 0:
        raise ValueError(f"gar: think_penalty must be <= 0, got {max_penalty}")
    if not (0 < target_ratio <= 1 and 0 < hard_ratio <= 1):
        raise ValueError(
            f"gar: think_target_ratio and think_hard_ratio must be in (0, 1], got "
            f"{target_ratio}, {hard_ratio}"
        )
    if not 0 < lo <= hi:
        raise ValueError(f"gar: think_target_range must be 0 < lo <= hi, got {target_range}")
    if not 0 < hard <= target:
        raise ValueError(f"gar: think_fallback must be 0 < hard <= target, got {fallback}")
