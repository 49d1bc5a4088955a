"""The ad-platform simulator: a configuration run over users for some days (vectorised numpy).

Each day has T = 4 slots. In slot t, user i of population p with satisfaction s_i, fatigue
f_i, annoyance a_i and habit h_i views

    n_i = n_p · exp(0.5 s_i − 0.5 f_i − 0.6 a_i + 0.4 h_i) · (1 + 0.4 ν_p) / T

feed items (ν_p: the reminder rate `reminders_<pop>`), of which a share
ℓ_i = min(0.5, ad_load · m_p) are ads (m_p: `ad_load_<pop>`). Ads go to advertisers by a
softmax over the ranking score

    score_ij = (1 − qw) · log bid_j + qw · 4 · rel_ij · q_j − 0.6 · max(0, reserve − bid_j),
    rel_ij = (1 + u_i·a_j) / 2,

mixed with uniform exploration ε; impressions are capped per user and advertiser per day
(frequency cap) and by each advertiser's paced budget (by slot t it may have spent
min(1, pacing · (t + 1)/T) of its budget). Clicks = impressions × σ(c_p + 2 rel_ij q_j − 1 − f_i),
revenue = clicks × bid (cost per click), conversions = clicks × 0.1 q_j. Satisfaction and
fatigue move with what was shown:

    s_i += 0.15 · ads_i/n_i · (mean rel·q of shown ads − 0.45) − 0.12 κ_p · ads_i/n_i
    f_i += 0.25 · φ_p · Σ_j imp_ij² / (n_i + 1) + 0.05 · ads_i/n_i

Overnight (`night`): survival to the next day is multiplied by
1 − σ(h_p − 1.5 s_i + 1.2 f_i + a_i − 0.8 h_i + c) (a_i, h_i as they were during the day;
c = `churn_shift`, −0.8 live, 0 stationary); then
s ← 0.85 s, f ← 0.5 f, and the slow state moves (`Dynamics`):

    a_i ← keep_a · a_i + gain_a · (ψ_p · max(0, ads_i/n_i − 0.08) + ζ_p · ν_p)    annoyance
    h_i ← keep_h · h_i + gain_h · (mean rel·q of the day's shown ads − 0.35)      habit

A user's value on day d is survival × (revenue + 0.05 · items viewed) (usage is worth
something to the platform beyond ads). The 7-day value is the sum over days 1..7.

Two worlds (`Dynamics`): STATIONARY (the first version: gains 0, so a and h stay 0 and
every day starts from the same kind of state) and LIVE, where annoyance and habit build
up over days and weeks: a day-1 A/B signal does not show them at all (they act from day 2),
and user state carries over from day to day on the live population (`live.py`). With the
parameters added later at their defaults, STATIONARY reproduces the first version's numbers
exactly.

Everything is an expectation except the day-1 observed signals of an A/B test, which the
harness draws as Poisson counts (finite traffic): so the truth is deterministic and the
observation noisy, both by seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policyopt.envs.ads.adsim.params import AdParams
from policyopt.envs.ads.adsim.world import (
    ANNOY_SENS,
    CHURN_LOGIT,
    CLICK_LOGIT,
    ITEMS,
    LOAD_SENS,
    NOTIFY_ANNOY,
    REPEAT_SENS,
    Advertisers,
    Users,
    UserState,
)

SLOTS = 4  # T
USAGE_VALUE = 0.05
TEMPERATURE = 0.12  # softmax temperature of the ranking score
MAX_AD_SHARE = 0.5  # ℓ_i never exceeds this, whatever the multipliers
REMINDER_ITEMS = 0.4  # items viewed × (1 + 0.4 ν)
RESERVE_SLOPE = 0.6  # score lost per unit of bid below the reserve price
ANNOY_FREE = 0.08  # an ad share users tolerate without annoyance
HABIT_REF = 0.35  # shown ads' rel·q above it build habit, below it erode it


@dataclass(frozen=True)
class Dynamics:
    """How the slow state moves overnight (module docstring); all 0 = stationary."""

    annoy_keep: float = 0.0
    annoy_gain: float = 0.0
    habit_keep: float = 0.0
    habit_gain: float = 0.0
    churn_shift: float = 0.0  # added to every churn logit (live users are a retained base)


STATIONARY = Dynamics()
LIVE = Dynamics(annoy_keep=0.92, annoy_gain=0.6, habit_keep=0.9, habit_gain=0.5, churn_shift=-0.8)
WORLDS = {"stationary": STATIONARY, "live": LIVE}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass
class DayResult:
    """Per user (expected) totals of one day [U], and per slot means over users [T]."""

    items: np.ndarray
    impressions: np.ndarray
    clicks: np.ndarray
    conversions: np.ndarray
    revenue: np.ndarray
    slot_items: np.ndarray  # [T, U]
    slot_clicks: np.ndarray  # [T, U]
    slot_revenue: np.ndarray  # [T, U]
    relq: np.ndarray  # [U] mean rel·q of the ads shown (impression-weighted)


def allocation(users: Users, ads: Advertisers, p: AdParams) -> tuple[np.ndarray, np.ndarray]:
    """(π [U, A] share of a user's ad traffic per advertiser, rel·q [U, A])."""
    rel = (1 + users.interests @ ads.topics.T) / 2
    relq = rel * ads.quality[None, :]
    score = (1 - p.quality_weight) * np.log(ads.bids)[None, :] + p.quality_weight * 4 * relq
    score = score - RESERVE_SLOPE * np.maximum(p.reserve_price - ads.bids, 0.0)[None, :]
    z = np.exp((score - score.max(1, keepdims=True)) / TEMPERATURE)
    pi = z / z.sum(1, keepdims=True)
    pi = (1 - p.exploration_rate) * pi + p.exploration_rate / ads.bids.size
    return pi, relq


def simulate_day(
    users: Users,
    ads: Advertisers,
    p: AdParams,
    state: UserState,
    alloc: tuple[np.ndarray, np.ndarray] | None = None,
) -> DayResult:
    """One day; updates `state.sat` and `state.fat` [U] in place (within-day drift, not the
    night). `alloc` is `allocation(users, ads, p)` when the caller has it already."""
    pop = users.population
    sat, fat = state.sat, state.fat
    slow = -0.6 * state.annoy + 0.4 * state.habit  # fixed within the day
    load = np.minimum(p.ad_load * p.per_population("ad_load")[pop], MAX_AD_SHARE)
    remind = 1 + REMINDER_ITEMS * p.per_population("reminders")[pop]
    pi, relq = alloc if alloc is not None else allocation(users, ads, p)
    shown = np.zeros_like(pi)  # impressions so far today [U, A]
    spent = np.zeros(ads.bids.size)
    budget = ads.budgets * len(users) / 1000.0
    slots = {
        k: np.zeros((SLOTS, len(users)))
        for k in ("items", "clicks", "revenue", "imps", "conv", "relq")
    }
    for t in range(SLOTS):
        items = ITEMS[pop] * np.exp(0.5 * sat - 0.5 * fat + slow) / SLOTS * remind
        want = (load * items)[:, None] * pi
        imps = np.minimum(want, np.maximum(p.frequency_cap - shown, 0.0))
        ctr = _sigmoid(CLICK_LOGIT[pop][:, None] + 2 * relq - 1 - fat[:, None])
        cost = (imps * ctr).sum(0) * ads.bids
        room = np.maximum(np.minimum(1.0, p.pacing_rate * (t + 1) / SLOTS) * budget - spent, 0.0)
        scale = np.where(cost > room, room / np.maximum(cost, 1e-12), 1.0)
        imps = imps * scale[None, :]
        clicks = imps * ctr
        spent += (clicks * ads.bids).sum(0)
        shown += imps
        n_ads = imps.sum(1)
        share = n_ads / np.maximum(items, 1e-9)
        mean_relq = (imps * relq).sum(1) / np.maximum(n_ads, 1e-9)
        sat += 0.15 * share * (mean_relq - 0.45) - 0.12 * LOAD_SENS[pop] * share
        fat += 0.25 * REPEAT_SENS[pop] * (imps**2).sum(1) / (items + 1) + 0.05 * share
        slots["items"][t] = items
        slots["clicks"][t] = clicks.sum(1)
        slots["revenue"][t] = (clicks * ads.bids[None, :]).sum(1)
        slots["imps"][t] = n_ads
        slots["relq"][t] = (imps * relq).sum(1)
        slots["conv"][t] = (clicks * 0.1 * ads.quality[None, :]).sum(1)
    return DayResult(
        items=slots["items"].sum(0),
        impressions=slots["imps"].sum(0),
        clicks=slots["clicks"].sum(0),
        conversions=slots["conv"].sum(0),
        revenue=slots["revenue"].sum(0),
        slot_items=slots["items"],
        slot_clicks=slots["clicks"],
        slot_revenue=slots["revenue"],
        relq=slots["relq"].sum(0) / np.maximum(slots["imps"].sum(0), 1e-9),
    )


def night(users: Users, p: AdParams, state: UserState, day: DayResult, dyn: Dynamics) -> np.ndarray:
    """The night after `day` (module docstring): updates `state` in place; returns each
    user's probability of surviving to the next day [U]."""
    pop = users.population
    logit = CHURN_LOGIT[pop] - 1.5 * state.sat + 1.2 * state.fat
    logit = logit + state.annoy - 0.8 * state.habit + dyn.churn_shift
    survive = 1 - _sigmoid(logit)
    share = day.impressions / np.maximum(day.items, 1e-9)
    nu = p.per_population("reminders")[pop]
    state.annoy = dyn.annoy_keep * state.annoy + dyn.annoy_gain * (
        ANNOY_SENS[pop] * np.maximum(share - ANNOY_FREE, 0.0) + NOTIFY_ANNOY[pop] * nu
    )
    shown = day.impressions > 0  # habit moves with the quality of what was shown
    state.habit = dyn.habit_keep * state.habit + dyn.habit_gain * np.where(
        shown, day.relq - HABIT_REF, 0.0
    )
    state.sat = state.sat * 0.85
    state.fat = state.fat * 0.5
    return survive


@dataclass
class RunResult:
    day1: DayResult
    daily_value: np.ndarray  # [days, U]: survival × (revenue + USAGE_VALUE · items)

    @property
    def value(self) -> np.ndarray:
        """Each user's value summed over the days [U]."""
        return self.daily_value.sum(0)


def run(
    users: Users,
    ads: Advertisers,
    p: AdParams,
    days: int = 7,
    dyn: Dynamics = STATIONARY,
) -> RunResult:
    """Run configuration `p` for `days` days from the users' state (`users.state`, not
    changed; a fresh state s = f = a = h = 0 when they carry none), survival 1 on day 1."""
    n = len(users)
    state = users.current_state()
    alive = np.ones(n)
    daily = np.zeros((days, n))
    first: DayResult | None = None
    alloc = allocation(users, ads, p)  # the same every day
    for d in range(days):
        day = simulate_day(users, ads, p, state, alloc)
        first = first or day
        daily[d] = alive * (day.revenue + USAGE_VALUE * day.items)
        alive = alive * night(users, p, state, day, dyn)
    assert first is not None
    return RunResult(first, daily)
