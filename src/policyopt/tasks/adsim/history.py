"""A history of past A/B experiments, the data the LRP is trained and evaluated on.

Experiment k starts on day k // per_day. Its control is a configuration the rule agent can
produce (each parameter at one of the document's levels, or its default); its treatment
changes one or two parameters to another level, as one or two edits of the document would.
"""

from __future__ import annotations

import numpy as np

from policyopt.tasks.adsim.abtest import AdPlatform, Experiment
from policyopt.tasks.adsim.params import NAMES, AdParams

LEVEL_FRACTIONS = (0.05, 0.25, 0.5, 0.75, 0.95)


def random_levels(rng: np.random.Generator) -> dict[str, float]:
    """Fractions per parameter: a document level, or (probability 0.2) the default."""
    default = AdParams().vector()
    return {
        n: float(rng.choice(LEVEL_FRACTIONS)) if rng.uniform() < 0.8 else float(default[i])
        for i, n in enumerate(NAMES)
    }


def make_history(
    platform: AdPlatform, n: int, per_day: int = 4, seed: int = 0, first_id: int = 0
) -> list[Experiment]:
    """n experiments with true 7-day labels, ids first_id.., days (id − first_id) // per_day."""
    rng = np.random.default_rng([platform.seed, 4, seed])
    out = []
    for k in range(n):
        control = random_levels(rng)
        treatment = dict(control)
        for name in rng.choice(NAMES, size=int(rng.integers(1, 3)), replace=False):
            treatment[str(name)] = float(
                rng.choice([f for f in LEVEL_FRACTIONS if f != control[str(name)]])
            )
        out.append(
            platform.ab_test(
                first_id + k,
                k // per_day,
                AdParams.from_fractions(control),
                AdParams.from_fractions(treatment),
                truth=True,
            )
        )
    return out
