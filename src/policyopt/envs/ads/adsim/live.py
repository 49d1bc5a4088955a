"""The live population (live world): the platform's users as they live day after day.

A panel of N users with their state (satisfaction, fatigue, annoyance, habit). Each day the
deployed configuration runs on all of them (`simulate_day`, then `night`); a user who churns
that night (drawn with their churn probability, seeded by the day) leaves and a new user
arrives in their place, with a fresh state and a population drawn from the day's drifting
arrival shares (`world.arrival_shares`). So what was deployed yesterday is in today's
users: an aggressive configuration leaves them less satisfied, more annoyed and fewer of
the populations it drives away; and the mix moves with the arrivals and with who churns.

A/B tests sample their users from the panel as it is on their day (`sample`); each day's
record (`records`) holds the realised value per user and the mean state and mix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policyopt.envs.ads.adsim.params import AdParams
from policyopt.envs.ads.adsim.simulator import USAGE_VALUE, Dynamics, night, simulate_day
from policyopt.envs.ads.adsim.world import (
    Advertisers,
    Users,
    UserState,
    arrival_shares,
    make_users,
)


class LivePopulation:
    def __init__(self, seed: int, size: int, ads: Advertisers, dyn: Dynamics) -> None:
        self.seed, self.ads, self.dyn = seed, ads, dyn
        users = make_users(size, np.random.default_rng([seed, 8]), arrival_shares(0))
        self.users = Users(users.population, users.interests)
        self.state = UserState.fresh(size)
        self.day = 0  # the day the panel is at (the next day to be lived)
        self.records: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.users)

    def snapshot(self) -> Users:
        """The panel's users with a copy of their state now."""
        return Users(self.users.population, self.users.interests, self.state.copy())

    def sample(self, n: int, rng: np.random.Generator) -> Users:
        """n of today's users (without replacement when the panel is large enough)."""
        idx = rng.choice(len(self), size=n, replace=n > len(self))
        return self.snapshot().take(idx)

    def mean_state(self) -> dict[str, float]:
        return {k: float(getattr(self.state, k).mean()) for k in ("sat", "fat", "annoy", "habit")}

    def step(self, p: AdParams) -> dict[str, Any]:
        """Live one day under configuration `p`; churned users are replaced overnight."""
        day = simulate_day(self.users, self.ads, p, self.state)
        value = float((day.revenue + USAGE_VALUE * day.items).mean())
        survive = night(self.users, p, self.state, day, self.dyn)
        rng = np.random.default_rng([self.seed, 8, self.day])
        leave = np.flatnonzero(rng.uniform(size=len(self)) >= survive)
        new = make_users(len(leave), rng, arrival_shares(self.day + 1))
        pop, interests = self.users.population.copy(), self.users.interests.copy()
        pop[leave], interests[leave] = new.population, new.interests
        self.users = Users(pop, interests)
        self.state.put(leave, UserState.fresh(len(leave)))
        record = {
            "day": self.day,
            "value": value,
            "churned": len(leave) / len(self),
            **self.mean_state(),
            "shares": self.users.shares().tolist(),
        }
        self.records.append(record)
        self.day += 1
        return record
