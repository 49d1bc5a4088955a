"""The ad-platform simulator: a configuration run over users for some days (vectorised numpy).

Each day has T = 4 slots. In slot t, user i with satisfaction s_i and fatigue f_i views
n_i = n_p · exp(0.5 s_i − 0.5 f_i) / T feed items, of which a share `ad_load` are ads. Ads
go to advertisers by a softmax over the ranking score

    score_ij = (1 − qw) · log bid_j + qw · 4 · rel_ij · q_j,   rel_ij = (1 + u_i·a_j) / 2,

mixed with uniform exploration ε; impressions are capped per user and advertiser per day
(frequency cap) and by each advertiser's paced budget (by slot t it may have spent
min(1, pacing · (t + 1)/T) of its budget). Clicks = impressions × σ(c_p + 2 rel_ij q_j − 1 − f_i),
revenue = clicks × bid (cost per click), conversions = clicks × 0.1 q_j. Satisfaction and
fatigue move with what was shown:

    s_i += 0.15 · ads_i/n_i · (mean rel·q of shown ads − 0.45) − 0.12 κ_p · ads_i/n_i
    f_i += 0.25 · φ_p · Σ_j imp_ij² / (n_i + 1) + 0.05 · ads_i/n_i

and overnight s ← 0.85 s, f ← 0.5 f. Survival to the next day is multiplied by
1 − σ(h_p − 1.5 s_i + 1.2 f_i). A user's value on day d is survival × (revenue + 0.03 ·
items viewed) (usage is worth something to the platform beyond ads). The 7-day value is the
sum over days 1..7. Day 1 shows the within-day drift only a little, most of the long-term
harm of ad load and repetition builds up over the week, and it differs by population.

Everything is an expectation except the day-1 observed signals of an A/B test, which the
harness draws as Poisson counts (finite traffic): so the truth is deterministic and the
observation noisy, both by seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policyopt.tasks.adsim.params import AdParams
from policyopt.tasks.adsim.world import (
    CHURN_LOGIT,
    CLICK_LOGIT,
    ITEMS,
    LOAD_SENS,
    REPEAT_SENS,
    Advertisers,
    Users,
)

SLOTS = 4  # T
USAGE_VALUE = 0.05
TEMPERATURE = 0.12  # softmax temperature of the ranking score


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


def allocation(users: Users, ads: Advertisers, p: AdParams) -> tuple[np.ndarray, np.ndarray]:
    """(π [U, A] share of a user's ad traffic per advertiser, rel·q [U, A])."""
    rel = (1 + users.interests @ ads.topics.T) / 2
    relq = rel * ads.quality[None, :]
    score = (1 - p.quality_weight) * np.log(ads.bids)[None, :] + p.quality_weight * 4 * relq
    z = np.exp((score - score.max(1, keepdims=True)) / TEMPERATURE)
    pi = z / z.sum(1, keepdims=True)
    pi = (1 - p.exploration_rate) * pi + p.exploration_rate / ads.bids.size
    return pi, relq


def simulate_day(
    users: Users,
    ads: Advertisers,
    p: AdParams,
    sat: np.ndarray,
    fat: np.ndarray,
    alloc: tuple[np.ndarray, np.ndarray] | None = None,
) -> DayResult:
    """One day; updates `sat` and `fat` [U] in place (within-day drift, not the night).
    `alloc` is `allocation(users, ads, p)` when the caller has it already."""
    pop = users.population
    pi, relq = alloc if alloc is not None else allocation(users, ads, p)
    shown = np.zeros_like(pi)  # impressions so far today [U, A]
    spent = np.zeros(ads.bids.size)
    budget = ads.budgets * len(users) / 1000.0
    slots = {
        k: np.zeros((SLOTS, len(users))) for k in ("items", "clicks", "revenue", "imps", "conv")
    }
    for t in range(SLOTS):
        items = ITEMS[pop] * np.exp(0.5 * sat - 0.5 * fat) / SLOTS
        want = (p.ad_load * items)[:, None] * pi
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
    )


@dataclass
class RunResult:
    day1: DayResult
    daily_value: np.ndarray  # [days, U]: survival × (revenue + USAGE_VALUE · items)

    @property
    def value(self) -> np.ndarray:
        """Each user's value summed over the days [U]."""
        return self.daily_value.sum(0)


def run(users: Users, ads: Advertisers, p: AdParams, days: int = 7) -> RunResult:
    """Run configuration `p` for `days` days from a fresh state (s = f = 0, survival 1)."""
    n = len(users)
    sat, fat, alive = np.zeros(n), np.zeros(n), np.ones(n)
    daily = np.zeros((days, n))
    first: DayResult | None = None
    h = CHURN_LOGIT[users.population]
    alloc = allocation(users, ads, p)  # the same every day
    for d in range(days):
        day = simulate_day(users, ads, p, sat, fat, alloc)
        first = first or day
        daily[d] = alive * (day.revenue + USAGE_VALUE * day.items)
        alive = alive * (1 - _sigmoid(h - 1.5 * sat + 1.2 * fat))
        sat *= 0.85
        fat *= 0.5
    assert first is not None
    return RunResult(first, daily)


def long_term_value(users: Users, ads: Advertisers, p: AdParams, days: int = 7) -> float:
    """The mean per-user 7-day value of configuration `p` (expected; deterministic)."""
    return float(run(users, ads, p, days).value.mean())
