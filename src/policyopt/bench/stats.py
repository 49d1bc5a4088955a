"""Paired step-time ratios with a 95% interval, and rounds repeated until it is narrow.

One bench round times every arm once (interleaved), so each round gives one paired ratio
t_arm / t_first per arm. Over n rounds the interval is the mean ratio ± t_{0.975, n-1} s/√n
(Student's t; s the sample standard deviation of the per-round ratios). A 3% overhead
target needs an interval narrower than 0.03 to say which side of it a method is on: three
quiet runs of one short HISPO bench gave 0.97, 1.05 and 1.13.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from policyopt.core.stats import t975


def ratio_interval(ratios: Sequence[float]) -> dict[str, float]:
    """Mean of per-round paired ratios with its 95% interval: mean, low, high, width, n."""
    n = len(ratios)
    if n < 2:
        raise ValueError(f"a 95% interval needs at least 2 paired rounds, got {n}")
    mean = statistics.fmean(ratios)
    half = t975(n - 1) * statistics.stdev(ratios) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "width": 2 * half, "n": n}


def repeat_until_narrow(
    run_round: Callable[[int], None],
    ratios: Callable[[], dict[str, list[float]]],
    *,
    width: float,
    min_rounds: int,
    max_rounds: int,
) -> dict[str, dict[str, float | bool]]:
    """Call `run_round(i)` for i = 0, 1, ... until every arm's 95% interval (from `ratios()`,
    arm -> per-round paired ratios so far) is at most `width` wide, after at least
    `min_rounds` and at most `max_rounds` rounds. Returns each arm's `ratio_interval` and
    whether it got narrow enough (`converged`)."""
    if not width > 0:
        raise ValueError(f"interval width {width}: give a positive number, e.g. 0.03")
    if not 2 <= min_rounds <= max_rounds:
        raise ValueError(f"rounds: need 2 <= min ({min_rounds}) <= max ({max_rounds})")
    done = 0
    while True:
        run_round(done)
        done += 1
        if done < min_rounds:
            continue
        intervals = {arm: ratio_interval(r) for arm, r in ratios().items()}
        narrow = all(iv["width"] <= width for iv in intervals.values())
        if narrow or done >= max_rounds:
            return {arm: {**iv, "converged": iv["width"] <= width} for arm, iv in intervals.items()}
