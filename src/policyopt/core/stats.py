"""The 95% Student-t interval of a mean, for every table that reports seeds or rounds.

For n values with mean m and sample standard deviation s (n - 1 in the denominator), the
half-width is t_{0.975, n-1} s / sqrt(n). Study reports, comparison tables, the DMRL and
SRPO studies and the bench's paired ratios all use this one function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def t975(df: int) -> float:
    """t_{0.975, df}, the two-sided 95% quantile of Student's t with df degrees of freedom."""
    if df < 1:
        raise ValueError(f"t quantile: {df} degrees of freedom; need at least 1")
    from scipy.stats import t  # scipy is slow to import; only tables need it

    return float(t.ppf(0.975, df))


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% Student-t interval); the half-width is nan for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci: no values")
    mean = math.fsum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n)
