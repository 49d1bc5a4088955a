"""The ad allocator's whitelisted parameters and their allowed ranges.

Six global parameters and two per population (`POP_WORDS`: casual, loyal, clickers, core):
`ad_load_<pop>` multiplies the global ad load for that population's users (1 = as global),
and `reminders_<pop>` is the rate of reminder notifications sent to them (0 = none). The
defaults of the parameters added after the first version (reserve price 0, multipliers 1,
no reminders) leave the allocation exactly as it was.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from policyopt.envs.ads.adsim.world import POP_WORDS

# name -> (low, high): the allowed range of each whitelisted parameter.
RANGES: dict[str, tuple[float, float]] = {
    "ad_load": (0.02, 0.30),  # share of feed items that are ads
    "quality_weight": (0.0, 1.0),  # weight of relevance × quality (vs bid) in the ranking score
    "pacing_rate": (0.5, 1.5),  # how fast advertisers may spend their daily budget
    "exploration_rate": (0.0, 0.3),  # share of ad traffic spread uniformly over advertisers
    "frequency_cap": (1.0, 10.0),  # impressions of one advertiser per user per day
    "reserve_price": (0.0, 12.0),  # bids below it are ranked down (a soft floor)
}
for _pop in POP_WORDS:
    RANGES[f"ad_load_{_pop}"] = (0.2, 1.8)  # × the global ad load for this population
for _pop in POP_WORDS:
    RANGES[f"reminders_{_pop}"] = (0.0, 1.0)  # reminder notifications per day, as a rate
NAMES = tuple(RANGES)


@dataclass(frozen=True)
class AdParams:
    ad_load: float = 0.10
    quality_weight: float = 0.5
    pacing_rate: float = 1.0
    exploration_rate: float = 0.05
    frequency_cap: float = 4.0
    reserve_price: float = 0.0
    ad_load_casual: float = 1.0
    ad_load_loyal: float = 1.0
    ad_load_clickers: float = 1.0
    ad_load_core: float = 1.0
    reminders_casual: float = 0.0
    reminders_loyal: float = 0.0
    reminders_clickers: float = 0.0
    reminders_core: float = 0.0

    def __post_init__(self) -> None:
        for name, (lo, hi) in RANGES.items():
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"ad parameter {name}={value} is outside its range [{lo}, {hi}]")

    def per_population(self, prefix: str) -> np.ndarray:
        """The per-population parameter `prefix`_<pop> as an array [4] (POP_WORDS order)."""
        return np.array([getattr(self, f"{prefix}_{w}") for w in POP_WORDS])

    def vector(self) -> np.ndarray:
        """The parameters scaled to [0, 1] by their ranges, in `NAMES` order."""
        return np.array([(getattr(self, n) - lo) / (hi - lo) for n, (lo, hi) in RANGES.items()])

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @staticmethod
    def from_fractions(fractions: dict[str, float]) -> AdParams:
        """Parameters at the given fractions of their ranges (clipped to [0, 1]); names
        missing from `fractions` keep their defaults."""
        unknown = set(fractions) - set(RANGES)
        if unknown:
            raise ValueError(f"unknown ad parameter(s) {sorted(unknown)}; valid: {list(NAMES)}")
        values = {f.name: getattr(AdParams(), f.name) for f in fields(AdParams)}
        for name, frac in fractions.items():
            lo, hi = RANGES[name]
            values[name] = lo + (hi - lo) * float(np.clip(frac, 0.0, 1.0))
        return AdParams(**values)

    @staticmethod
    def clipped(values: dict[str, float]) -> AdParams:
        """Parameters from raw values, each clipped into its range."""
        base = AdParams().as_dict()
        for name, v in values.items():
            if name not in RANGES:
                raise ValueError(f"unknown ad parameter {name!r}; valid: {list(NAMES)}")
            lo, hi = RANGES[name]
            base[name] = float(np.clip(v, lo, hi))
        return AdParams(**base)


# One field per whitelisted parameter, in RANGES order (vector() and the LRP rely on it).
assert tuple(f.name for f in fields(AdParams)) == NAMES, "AdParams fields must match RANGES"
