"""A large-search baseline over the editor's level grid: the best configuration a fixed
budget of true-value evaluations finds, so that a deployed value can be reported as regret.

The grid: each whitelisted parameter at one of the document's five levels or its default
(`OPTIONS`), what the rule agent can produce. It holds 5^14 ≈ 6.1e9 level points
(2.6e10 distinct configurations with the defaults), far too many to search exhaustively.
The search spends half its budget on uniform random points, then coordinate ascent from the
best: parameters in a seeded random order, each set to its best option with the others
fixed, passes repeated until one changes nothing or the budget is spent. Values are cached
per configuration, so a repeated point costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from policyopt.envs.ads.adsim.history import LEVEL_FRACTIONS
from policyopt.envs.ads.adsim.params import NAMES, AdParams


def options(name: str) -> tuple[float, ...]:
    """Range fractions parameter `name` can take on the grid: the levels and its default."""
    default = float(AdParams().vector()[NAMES.index(name)])
    return tuple(sorted({*LEVEL_FRACTIONS, default}))


OPTIONS = {n: options(n) for n in NAMES}
LEVEL_GRID_SIZE = len(LEVEL_FRACTIONS) ** len(NAMES)
DISTINCT_CONFIGURATIONS = int(np.prod([len(v) for v in OPTIONS.values()]))


@dataclass
class SearchResult:
    best: dict[str, float]  # range fractions per parameter
    value: float
    evaluations: int  # distinct configurations evaluated
    trace: list[float] = field(default_factory=list)  # best value after each evaluation

    def params(self) -> AdParams:
        return AdParams.from_fractions(self.best)


def large_search(
    value: Callable[[AdParams], float], budget: int = 1000, seed: int = 0
) -> SearchResult:
    """Random search (budget/2) then coordinate ascent (module docstring) maximising
    `value`; at most `budget` distinct evaluations."""
    rng = np.random.default_rng([seed, 13])
    cache: dict[tuple[float, ...], float] = {}
    trace: list[float] = []

    def f(fr: dict[str, float]) -> float:
        key = tuple(fr[n] for n in NAMES)
        if key not in cache:
            cache[key] = float(value(AdParams.from_fractions(fr)))
            trace.append(max(cache[key], trace[-1] if trace else -np.inf))
        return cache[key]

    best = {n: float(AdParams().vector()[i]) for i, n in enumerate(NAMES)}
    best_v = f(best)
    while len(cache) < budget // 2:
        fr = {n: float(rng.choice(OPTIONS[n])) for n in NAMES}
        if (v := f(fr)) > best_v:
            best, best_v = fr, v
    improved = True
    while improved and len(cache) < budget:
        improved = False
        for name in rng.permutation(NAMES):
            for opt in OPTIONS[str(name)]:
                if len(cache) >= budget:
                    break
                fr = {**best, str(name): opt}
                if (v := f(fr)) > best_v:
                    best, best_v, improved = fr, v, True
    return SearchResult(best, best_v, len(cache), trace)
