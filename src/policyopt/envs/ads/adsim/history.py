"""A history of past A/B experiments, the data the LRP is trained and evaluated on.

Experiment k starts on day k // per_day. Its treatment changes one or two parameters of its
control to another level, as one or two edits of the document would. The control:

- stationary world: a configuration the rule agent can produce, drawn per experiment (each
  parameter at one of the document's levels, or its default);
- live world: the configuration deployed that day (`offline_control`: a seeded schedule that
  starts at the defaults and moves one or two parameters every few days), which the live
  population lives under before the next day (`AdPlatform.advance`). `burn_in` brings a
  fresh platform of the same seed to any day of that schedule: the live task starts from the
  population the history left.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from policyopt.envs.ads.adsim.abtest import AdPlatform, Experiment
from policyopt.envs.ads.adsim.params import NAMES, AdParams

LEVEL_FRACTIONS = (0.05, 0.25, 0.5, 0.75, 0.95)
SCHEDULE_MOVE = 0.3  # daily probability that the offline deployed configuration changes


def random_levels(rng: np.random.Generator) -> dict[str, float]:
    """Fractions per parameter: a document level, or (probability 0.2) the default."""
    default = AdParams().vector()
    return {
        n: float(rng.choice(LEVEL_FRACTIONS)) if rng.uniform() < 0.8 else float(default[i])
        for i, n in enumerate(NAMES)
    }


def _moved(fractions: dict[str, float], rng: np.random.Generator) -> dict[str, float]:
    """One or two parameters of `fractions` moved to another level."""
    out = dict(fractions)
    for name in rng.choice(NAMES, size=int(rng.integers(1, 3)), replace=False):
        out[str(name)] = float(rng.choice([f for f in LEVEL_FRACTIONS if f != out[str(name)]]))
    return out


@lru_cache(maxsize=8)
def _schedule(seed: int, days: int) -> tuple[tuple[tuple[str, float], ...], ...]:
    rng = np.random.default_rng([seed, 9])
    current = dict(zip(NAMES, (float(x) for x in AdParams().vector()), strict=True))
    out = []
    for _ in range(days):
        out.append(tuple(current.items()))
        if rng.uniform() < SCHEDULE_MOVE:
            current = _moved(current, rng)
    return tuple(out)


def offline_fractions(seed: int, day: int) -> dict[str, float]:
    """Range fractions of the configuration deployed on offline day `day` (live world)."""
    days = 64 * (day // 64 + 1)  # a schedule prefix long enough (prefixes agree)
    return dict(_schedule(seed, days)[day])


def offline_control(seed: int, day: int) -> AdParams:
    """The configuration deployed on offline day `day` (live world; module docstring)."""
    return AdParams.from_fractions(offline_fractions(seed, day))


def burn_in(platform: AdPlatform, day: int) -> None:
    """Advance `platform`'s live population to `day` under the offline schedule."""
    platform.advance_to(day, lambda d: offline_control(platform.seed, d))


def make_history(
    platform: AdPlatform, n: int, per_day: int = 4, seed: int = 0, first_id: int = 0
) -> list[Experiment]:
    """n experiments with true 7-day labels, ids first_id.., days (id − first_id) // per_day.
    In the live world the platform must be at day 0 and is left at the day after the last."""
    rng = np.random.default_rng([platform.seed, 4, seed])
    out = []
    for k in range(n):
        day = k // per_day
        if platform.live is not None:
            burn_in(platform, day)
            control = offline_fractions(platform.seed, day)
        else:
            control = random_levels(rng)
        treatment = _moved(control, rng)
        out.append(
            platform.ab_test(
                first_id + k,
                day,
                AdParams.from_fractions(control),
                AdParams.from_fractions(treatment),
                truth=True,
            )
        )
    if out:
        burn_in(platform, out[-1].start_day + 1)
    return out
