"""Shared property checks for shipped reward functions under hostile model output.

Every reward function (TRL's signature `f(prompts, completions, **columns)`) must, on any
completion a model can emit: never raise, return one value per completion, each None
("unparseable", scored 0 by the pipeline) or a finite float in the reward's documented range,
and return within a time bound.

To cover a new reward (e.g. rankings), write in `tests/rewards/`:

    @REWARD_SETTINGS
    @given(completions=st.lists(<your hostile strategy, e.g. hostile_text(FRAGMENTS)>, ...))
    def test_my_reward_properties(completions):
        check_reward_function(my_reward, completions, {"column": [...] * len(completions)},
                              low=0.0, high=1.0, seconds=...)

`hostile_text(fragments)` mixes arbitrary unicode with the reward's own syntax
(`fragments`), repeated and truncated, which is where parsers break.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Modest example counts keep the suite fast; deadline=None because worker start-up and the
# shared CI machine make single examples slow now and then (the time bound is asserted
# explicitly by `check_reward_function` instead).
REWARD_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Characters that break naive parsers: NUL, controls, lone combining marks, RTL marks,
# surrogate-free astral characters, the replacement character.
ODD_CHARACTERS = ["\x00", "\x1b", "\u0301", "\u200f", "\ufffd", "\U0001f600", "\t", "\r\n"]


def hostile_text(fragments: Sequence[str], max_pieces: int = 40) -> st.SearchStrategy[str]:
    """Model-like output: pieces of arbitrary text, odd characters and the reward's own
    syntax `fragments`, sometimes one piece repeated many times (runaway generation)."""
    piece = st.one_of(
        st.text(max_size=12),
        st.sampled_from(ODD_CHARACTERS),
        st.sampled_from(list(fragments)),
    )
    joined = st.lists(piece, max_size=max_pieces).map("".join)
    repeated = st.tuples(st.sampled_from(list(fragments)), st.integers(1, 300)).map(
        lambda fr: fr[0] * fr[1]
    )
    return st.one_of(joined, repeated, st.text(max_size=200))


def check_reward_function(
    fn: Callable[..., Sequence[Any]],
    completions: list[str],
    columns: dict[str, list[Any]],
    *,
    low: float,
    high: float,
    seconds: float,
    allow_none: bool = True,
) -> list[float | None]:
    """Call `fn` on the completions; assert one value each, None (if `allow_none`) or a
    finite float in [low, high], within `seconds` of wall time. Returns the values."""
    prompts = ["prompt"] * len(completions)
    start = time.monotonic()
    values = list(fn(prompts, completions, **columns))
    elapsed = time.monotonic() - start
    assert elapsed <= seconds, f"{len(completions)} completions took {elapsed:.1f} s > {seconds} s"
    assert len(values) == len(completions)
    for completion, value in zip(completions, values, strict=True):
        if value is None:
            assert allow_none, f"None for {completion!r}"
            continue
        assert isinstance(value, float | int) and not isinstance(value, bool), repr(value)
        assert math.isfinite(value) and low <= value <= high, f"{value} for {completion!r}"
    return values
