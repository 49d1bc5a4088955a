"""Which response tokens enter GAR's signal: the marked reasoning span, capped in length.

With a `span_regex`, the span is its first match in the decoded text (capture group 1 if the
pattern has groups, else the whole match); the characters are mapped back to the tokens that
produced them. Without a pattern, or where it does not match, the whole response is used
(as in the authors' code). Either way only the last `max_span_tokens` tokens of the span are
kept (the authors' code truncates from the front as well).
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence

import torch


def find_span(text: str, pattern: re.Pattern[str]) -> tuple[int, int] | None:
    """Character range [start, end) of the span in `text`; None when absent or empty."""
    match = pattern.search(text)
    if match is None:
        return None
    start, end = match.span(1) if pattern.groups else match.span()
    return (start, end) if end > start else None


def char_to_token_span(
    start: int, end: int, n_tokens: int, prefix_chars: Callable[[int], int]
) -> tuple[int, int]:
    """Tokens [t0, t1) covering characters [start, end), where `prefix_chars(k)` is the length
    of the text of the first k tokens (non-decreasing in k). O(log n) calls."""
    positions = range(n_tokens + 1)
    t0 = bisect_right(positions, start, key=prefix_chars) - 1  # last k with prefix <= start
    t1 = bisect_left(positions, end, key=prefix_chars)  # first k with prefix >= end
    return max(t0, 0), min(max(t1, t0 + 1), n_tokens)


def token_spans(
    token_ids: Sequence[Sequence[int]],
    decode: Callable[[Sequence[int]], str],
    pattern: re.Pattern[str] | None,
    max_tokens: int,
) -> tuple[list[tuple[int, int]], int]:
    """[t0, t1) of each token sequence (capped to its last `max_tokens` tokens) and how many
    sequences fell back to the whole sequence because the pattern did not match."""
    spans, fallbacks = [], 0
    for ids in token_ids:
        t0, t1 = 0, len(ids)
        if pattern is not None:
            chars = find_span(decode(ids), pattern)
            if chars is None:
                fallbacks += 1
            else:
                t0, t1 = char_to_token_span(
                    *chars, len(ids), lambda k, ids=ids: len(decode(ids[:k]))
                )
        spans.append((max(t0, t1 - max_tokens), t1))
    return spans, fallbacks


def span_mask(spans: Sequence[tuple[int, int]], width: int) -> torch.Tensor:
    """[K, width] float mask, 1 on each row's [t0, t1)."""
    cols = torch.arange(width)
    lo = torch.tensor([s for s, _ in spans], dtype=torch.long)[:, None]
    hi = torch.tensor([e for _, e in spans], dtype=torch.long)[:, None]
    return ((cols >= lo) & (cols < hi)).float()
