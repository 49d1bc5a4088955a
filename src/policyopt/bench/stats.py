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

# Two-sided 95% quantiles of Student's t, t_{0.975, df}, for df = 1..30; beyond, 1.96.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """t_{0.975, df}; the normal 1.96 past 30 degrees of freedom (within 2% there)."""
    if df < 1:
        raise ValueError(f"t quantile: {df} degrees of freedom; need at least 1")
    return _T975[df - 1] if df <= len(_T975) else 1.96


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
