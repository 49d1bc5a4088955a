"""A/B tests on the simulator: control (best configuration so far) vs treatment (candidate).

Two worlds (`world`): "stationary" (the first version) and "live". In the stationary world an
experiment draws 2U fresh users (s = f = 0; population shares drawn around 41/26/14/19%
from a Dirichlet, seeded by the experiment's id). In the live world it samples 2U of the
live population's users as they are on its day (`live.py`: their state carries what was
deployed before, and the mix drifts), and the platform must be at that day: `advance`
lives one day of the deployed configuration. Either way the users are split at random
between the arms, and each arm's configuration runs from the users' state. What it returns:

- observed day-1 signals per arm and per population: per-user means of
  SIGNALS = (items, impressions, clicks, conversions, revenue), from Poisson counts around the
  simulator's expectations (finite traffic); and the within-day trajectory per slot of
  (items, clicks, revenue) per user;
- with `truth=True`, the true 7-day value per user of each arm's configuration and each
  population, over ALL the experiment's users (both halves: the simulator can run the
  counterfactual), so that treatment − control is the causal effect, free of the noise of
  which users fell in which half. It is the evaluation target, and the "matured" label of
  an experiment once 7 days have passed since it started (`matured_day = start_day + 7`).

`multi_arm_test` tests K candidates in one experiment against one control: (K + 1)·U users
of the day's traffic, assigned to the arms stratified by population (each population's users
dealt round-robin after a shuffle, so every arm holds the same population counts, ±1). It
returns one `Experiment` per candidate that shares the control arm's signals: the candidates'
lifts over that control are comparable with each other (common control, same population
mix), which separate A/B tests with their own users are not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from policyopt.envs.ads.adsim.live import LivePopulation
from policyopt.envs.ads.adsim.params import AdParams
from policyopt.envs.ads.adsim.simulator import (
    SLOTS,
    WORLDS,
    DayResult,
    RunResult,
    run,
    simulate_day,
)
from policyopt.envs.ads.adsim.world import SHARES, Advertisers, Users, make_advertisers, make_users

SIGNALS = ("items", "impressions", "clicks", "conversions", "revenue")
TRAJECTORY = ("items", "clicks", "revenue")
HORIZON = 7  # days until an experiment's long-term label matures
POPS = 4


@dataclass
class ArmSignals:
    """Observed day-1 signals of one arm."""

    pop_signals: np.ndarray  # [4, len(SIGNALS)] per-user means by population
    pop_trajectory: np.ndarray  # [4, SLOTS, len(TRAJECTORY)] per-user means by population
    pop_counts: np.ndarray  # [4] users of each population in the arm

    def aggregate(self) -> np.ndarray:
        """Per-user means over the whole arm [len(SIGNALS)]."""
        w = self.pop_counts / self.pop_counts.sum()
        return w @ self.pop_signals


@dataclass
class Experiment:
    id: int
    start_day: int
    control: AdParams
    treatment: AdParams
    shares: np.ndarray  # [4] population shares of the experiment's traffic
    arms: tuple[ArmSignals, ArmSignals]  # (control, treatment)
    # True 7-day value per user of each arm's configuration by population, over all the
    # experiment's users [2, 4]; None when run without truth.
    pop_values: np.ndarray | None = None

    @property
    def matured_day(self) -> int:
        return self.start_day + HORIZON

    def weights(self) -> np.ndarray:
        """Population shares of all the experiment's users [4]."""
        counts = self.arms[0].pop_counts + self.arms[1].pop_counts
        return counts / counts.sum()

    def arm_values(self) -> np.ndarray:
        """True 7-day value per user of (control, treatment) configurations [2], over all
        the experiment's users."""
        assert self.pop_values is not None, "experiment run without truth"
        return self.pop_values @ self.weights()

    @property
    def effect(self) -> float:
        """True 7-day effect: treatment's value per user minus control's."""
        v = self.arm_values()
        return float(v[1] - v[0])


WORLD_NAMES = tuple(WORLDS)


class AdPlatform:
    """A fixed set of advertisers and the traffic experiments draw users from (and in the
    live world, the live population they are drawn from)."""

    def __init__(
        self,
        seed: int = 0,
        advertisers: int = 20,
        users_per_arm: int = 400,
        world: str = "stationary",
        live_users: int = 4000,
    ) -> None:
        if world not in WORLDS:
            raise ValueError(f"ad platform: world must be one of {WORLD_NAMES}, got {world!r}")
        self.seed, self.world, self.dyn = seed, world, WORLDS[world]
        self.users_per_arm = users_per_arm
        self.ads: Advertisers = make_advertisers(advertisers, np.random.default_rng([seed, 1]))
        self.live = (
            LivePopulation(seed, live_users, self.ads, self.dyn) if world == "live" else None
        )

    @property
    def day(self) -> int | None:
        """The live population's day (None in the stationary world)."""
        return None if self.live is None else self.live.day

    def advance(self, params: AdParams) -> None:
        """Live one day of `params` on the live population (nothing in the stationary world)."""
        if self.live is not None:
            self.live.step(params)

    def advance_to(self, day: int, control_of: Callable[[int], AdParams]) -> None:
        """Live the days up to `day` (exclusive), day d under `control_of(d)`."""
        while self.live is not None and self.live.day < day:
            self.advance(control_of(self.live.day))

    def _check_day(self, start_day: int) -> None:
        if self.live is not None and self.live.day != start_day:
            raise ValueError(
                f"ad platform (live world): an experiment of day {start_day} on a live "
                f"population at day {self.live.day}; advance the platform to its day first"
            )

    def _draw(
        self, n: int, rng: np.random.Generator, shares: np.ndarray
    ) -> tuple[np.ndarray, Users]:
        """n users of the day: fresh with `shares` (stationary), else from the live panel
        (and their own shares)."""
        if self.live is None:
            return shares, make_users(n, rng, shares)
        users = self.live.sample(n, rng)
        return users.shares(), users

    def traffic(self, experiment_id: int) -> tuple[np.ndarray, Users, np.random.Generator]:
        rng = np.random.default_rng([self.seed, 2, experiment_id])
        shares, users = self._draw(2 * self.users_per_arm, rng, rng.dirichlet(SHARES * 40))
        return shares, users, rng

    def eval_users(self, n: int = 2000) -> Users:
        """A fixed held-out user sample to value configurations on: fresh users with the
        standard shares (stationary), or n of the live population's users with their state
        as it is now (live; a snapshot: later days do not change it)."""
        rng = np.random.default_rng([self.seed, 3])
        return make_users(n, rng) if self.live is None else self.live.sample(n, rng)

    def value(self, params: AdParams, users: Users | None = None, days: int = HORIZON) -> float:
        """True mean `days`-day value per user of a configuration on `users` (default eval
        users), from their state."""
        users = users if users is not None else self.eval_users()
        return float(self.run(users, params, days).value.mean())

    def run(self, users: Users, params: AdParams, days: int = HORIZON) -> RunResult:
        """`simulator.run` in this platform's world."""
        return run(users, self.ads, params, days, self.dyn)

    def ab_test(
        self,
        experiment_id: int,
        start_day: int,
        control: AdParams,
        treatment: AdParams,
        truth: bool = False,
    ) -> Experiment:
        self._check_day(start_day)
        shares, users, rng = self.traffic(experiment_id)
        order = rng.permutation(len(users))
        halves = (users.take(order[: self.users_per_arm]), users.take(order[self.users_per_arm :]))
        arms, values = [], []
        for arm_users, params in zip(halves, (control, treatment), strict=True):
            day1 = simulate_day(arm_users, self.ads, params, arm_users.current_state())
            arms.append(observe(day1, arm_users.population, rng))
            if truth:  # the configuration on every user of the experiment (counterfactual)
                per_user = self.run(users, params).value
                values.append(_by_pop(per_user[:, None], users.population)[:, 0])
        return Experiment(
            id=experiment_id,
            start_day=start_day,
            control=control,
            treatment=treatment,
            shares=shares,
            arms=(arms[0], arms[1]),
            pop_values=np.stack(values) if truth else None,
        )

    def multi_arm_test(
        self,
        experiment_id: int,
        start_day: int,
        control: AdParams,
        treatments: list[AdParams],
        truth: bool = False,
    ) -> list[Experiment]:
        """K treatments against one control in one experiment (module docstring)."""
        self._check_day(start_day)
        k = len(treatments)
        rng = np.random.default_rng([self.seed, 6, experiment_id])
        n_users = (k + 1) * self.users_per_arm
        shares, users = self._draw(n_users, rng, rng.dirichlet(SHARES * 40))
        arm_of = stratified_arms(users.population, k + 1, rng)
        configs = [control, *treatments]
        signals, values = [], []
        for a, params in enumerate(configs):
            arm_users = users.take(np.flatnonzero(arm_of == a))
            day1 = simulate_day(arm_users, self.ads, params, arm_users.current_state())
            signals.append(observe(day1, arm_users.population, rng))
            if truth:
                per_user = self.run(users, params).value
                values.append(_by_pop(per_user[:, None], users.population)[:, 0])
        return [
            Experiment(
                id=experiment_id,
                start_day=start_day,
                control=control,
                treatment=treatments[i],
                shares=shares,
                arms=(signals[0], signals[i + 1]),
                pop_values=np.stack([values[0], values[i + 1]]) if truth else None,
            )
            for i in range(k)
        ]


def stratified_arms(pop: np.ndarray, arms: int, rng: np.random.Generator) -> np.ndarray:
    """Arm index per user [U]: within each population, a random order dealt round-robin
    (arm counts per population differ by at most one; the starting arm rotates)."""
    out = np.empty(len(pop), dtype=int)
    start = 0
    for p in range(POPS):
        idx = rng.permutation(np.flatnonzero(pop == p))
        out[idx] = (start + np.arange(len(idx))) % arms
        start = (start + len(idx)) % arms
    return out


def _by_pop(x: np.ndarray, pop: np.ndarray) -> np.ndarray:
    """Per-population means of the rows of x [U, ...] -> [4, ...] (0 for an empty one)."""
    counts = np.bincount(pop, minlength=POPS).astype(float)
    sums = np.zeros((POPS, *x.shape[1:]))
    np.add.at(sums, pop, x)
    return sums / np.maximum(counts, 1).reshape(-1, *([1] * (x.ndim - 1)))


def observe(day: DayResult, pop: np.ndarray, rng: np.random.Generator) -> ArmSignals:
    """Day-1 signals as counted: Poisson draws around the expected per-slot counts."""
    items = rng.poisson(day.slot_items).astype(float)  # [T, U]
    clicks = rng.poisson(day.slot_clicks).astype(float)
    cpc = day.slot_revenue / np.maximum(day.slot_clicks, 1e-12)
    revenue = clicks * cpc
    imps = rng.poisson(day.impressions).astype(float)
    conv = rng.poisson(day.conversions).astype(float)
    per_user = np.stack([items.sum(0), imps, clicks.sum(0), conv, revenue.sum(0)], 1)
    traj = np.stack([items, clicks, revenue], -1).transpose(1, 0, 2)  # [U, T, 3]
    return ArmSignals(
        pop_signals=_by_pop(per_user, pop),
        pop_trajectory=_by_pop(traj, pop),
        pop_counts=np.bincount(pop, minlength=POPS).astype(float),
    )


__all__ = ["SLOTS", "AdPlatform", "ArmSignals", "Experiment", "make_users"]
