"""Users (in four populations) and advertisers of the ad-platform simulator.

Populations (DMRL paper: low/high short-term × low/high long-term value, 41/26/14/19%):

    0 "ST-low LT-low"   1 "ST-low LT-high"   2 "ST-high LT-low"   3 "ST-high LT-high"

Short-term value is the propensity to click ads (click logit offset); long-term value is a
high daily usage and a low churn hazard. High-LT users are the ones most hurt by ad load and
by repeated ads (larger load and repetition sensitivities): the tension the method is about.
All numbers are per population, in the arrays below; equations in docs/methods/dmrl.md.

The skill document and the per-population parameters name the populations by one word each
(`POP_WORDS`): casual, loyal, clickers, core. In the live world (`live.py`) new users arrive
with shares that drift over the days around `SHARES` (`arrival_shares`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POPULATIONS = ("st_low_lt_low", "st_low_lt_high", "st_high_lt_low", "st_high_lt_high")
POP_WORDS = ("casual", "loyal", "clickers", "core")  # one word each, for documents and names
SHARES = np.array([0.41, 0.26, 0.14, 0.19])
TOPICS = 8  # K, dimension of interests and ad topics

# Per population p (index as POPULATIONS):
CLICK_LOGIT = np.array([-3.4, -3.4, -2.4, -2.4])  # c_p: base click logit (short-term value)
ITEMS = np.array([30.0, 60.0, 30.0, 60.0])  # n_p: feed items viewed per day at s = f = 0
CHURN_LOGIT = np.array([-2.6, -4.0, -2.6, -4.0])  # h_p: daily churn logit at s = f = 0
LOAD_SENS = np.array([1.5, 7.0, 0.8, 6.0])  # κ_p: satisfaction lost per unit of ad share
REPEAT_SENS = np.array([0.8, 2.8, 0.4, 2.0])  # φ_p: fatigue per repeated impression share
# Live world only (slow state, simulator.py `night`):
ANNOY_SENS = np.array([0.6, 1.6, 0.3, 1.2])  # ψ_p: annoyance per unit of the day's ad share
NOTIFY_ANNOY = np.array([0.35, 0.08, 0.30, 0.10])  # ζ_p: annoyance per unit reminder rate

# Drift of the arrivals' mix: log-shares move by DRIFT_AMP · sin(2π d / DRIFT_PERIOD + phase_p).
DRIFT_AMP = 0.6
DRIFT_PERIOD = 80.0
DRIFT_PHASE = np.array([0.0, 0.5, 1.0, 1.5]) * np.pi


@dataclass
class UserState:
    """Per-user state [U]: satisfaction, fatigue (fast), annoyance, habit (slow)."""

    sat: np.ndarray
    fat: np.ndarray
    annoy: np.ndarray
    habit: np.ndarray

    @staticmethod
    def fresh(n: int) -> UserState:
        return UserState(np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))

    def copy(self) -> UserState:
        return UserState(self.sat.copy(), self.fat.copy(), self.annoy.copy(), self.habit.copy())

    def take(self, index: np.ndarray) -> UserState:
        return UserState(self.sat[index], self.fat[index], self.annoy[index], self.habit[index])

    def put(self, index: np.ndarray, other: UserState) -> None:
        """Overwrite the users at `index` with `other`'s (e.g. new arrivals)."""
        for name in ("sat", "fat", "annoy", "habit"):
            getattr(self, name)[index] = getattr(other, name)


@dataclass(frozen=True)
class Users:
    population: np.ndarray  # [U] int in 0..3
    interests: np.ndarray  # [U, K] unit vectors
    # Their state when sampled from the live population (None: fresh, s = f = a = h = 0).
    state: UserState | None = None

    def __len__(self) -> int:
        return len(self.population)

    def take(self, index: np.ndarray) -> Users:
        state = None if self.state is None else self.state.take(index)
        return Users(self.population[index], self.interests[index], state)

    def current_state(self) -> UserState:
        """A copy of their state (fresh when they carry none), to simulate from."""
        return self.state.copy() if self.state is not None else UserState.fresh(len(self))

    def shares(self) -> np.ndarray:
        """Population shares [4] of these users."""
        return np.bincount(self.population, minlength=4) / max(len(self), 1)


@dataclass(frozen=True)
class Advertisers:
    topics: np.ndarray  # [A, K] unit vectors
    bids: np.ndarray  # [A] cost per click
    budgets: np.ndarray  # [A] daily budget per 1000 users of traffic
    quality: np.ndarray  # [A] creative quality in (0, 1)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def make_users(n: int, rng: np.random.Generator, shares: np.ndarray = SHARES) -> Users:
    """n users: populations drawn with `shares`, interests from a skewed random direction."""
    pop = rng.choice(4, size=n, p=shares / shares.sum())
    interests = _unit(np.abs(rng.normal(size=(n, TOPICS))) ** 2 + 0.05)
    return Users(pop, interests)


def arrival_shares(day: int) -> np.ndarray:
    """Population shares [4] of the users who arrive on `day` (live world): a slow drift
    around `SHARES` (module docstring); day 0 is `SHARES` tilted by the phases."""
    logits = np.log(SHARES) + DRIFT_AMP * np.sin(2 * np.pi * day / DRIFT_PERIOD + DRIFT_PHASE)
    w = np.exp(logits - logits.max())
    return w / w.sum()


def make_advertisers(n: int, rng: np.random.Generator) -> Advertisers:
    """n advertisers; high bidders tend to have lower creative quality (bid vs quality)."""
    topics = _unit(np.abs(rng.normal(size=(n, TOPICS))) ** 2 + 0.05)
    z = rng.normal(size=n)
    bids = 6.0 * np.exp(0.5 * z)
    quality = 1 / (1 + np.exp(-(0.3 - 0.9 * z + 0.5 * rng.normal(size=n))))
    budgets = rng.uniform(0.5, 2.0, size=n) * 100.0
    return Advertisers(topics, bids, budgets, quality)
