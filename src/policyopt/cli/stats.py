"""Confidence intervals for study and comparison tables."""

from __future__ import annotations

import math


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% Student-t confidence interval."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
