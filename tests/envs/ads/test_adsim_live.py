"""The live world: state carried across days, delayed effects, drift, per-population
parameters, determinism; and the large-search baseline."""

from __future__ import annotations

import numpy as np
import pytest

from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import burn_in, make_history, offline_control
from policyopt.envs.ads.adsim.params import NAMES, AdParams
from policyopt.envs.ads.adsim.search import (
    DISTINCT_CONFIGURATIONS,
    LEVEL_GRID_SIZE,
    OPTIONS,
    large_search,
)
from policyopt.envs.ads.adsim.simulator import LIVE, STATIONARY, run, simulate_day
from policyopt.envs.ads.adsim.world import (
    POP_WORDS,
    SHARES,
    UserState,
    arrival_shares,
    make_advertisers,
    make_users,
)

REMIND_ALL = {f"reminders_{w}": 1.0 for w in POP_WORDS}
AGGRESSIVE = AdParams(ad_load=0.3, frequency_cap=10.0, **REMIND_ALL)
MILD = AdParams(ad_load=0.05)


def _lived(params: AdParams, days: int, seed: int = 0) -> AdPlatform:
    platform = AdPlatform(seed, users_per_arm=100, world="live", live_users=1500)
    for _ in range(days):
        platform.advance(params)
    return platform


def test_deploying_an_aggressive_configuration_carries_into_the_next_days():
    agg, mild = _lived(AGGRESSIVE, 3), _lived(MILD, 3)
    # the aggressive days paid more while they lasted ...
    assert agg.live.records[0]["value"] > 1.5 * mild.live.records[0]["value"]
    # ... and left the population less satisfied and more annoyed (measured -0.59 vs -0.20;
    # annoyance 0.42 vs 0)
    a, m = agg.live.mean_state(), mild.live.mean_state()
    assert a["sat"] < m["sat"] - 0.2
    assert a["annoy"] > m["annoy"] + 0.2
    # the same control tested on day 3 is worth less on the population the aggressive
    # days left (7-day value per user, measured 12.1 vs 19.3)
    va = agg.ab_test(1, 3, AdParams(), AdParams(), truth=True).arm_values()[0]
    vm = mild.ab_test(1, 3, AdParams(), AdParams(), truth=True).arm_values()[0]
    assert va < 0.8 * vm


def test_stationary_platform_starts_every_experiment_fresh():
    platform = AdPlatform(0, users_per_arm=100)
    before = platform.ab_test(1, 0, AdParams(), AdParams(), truth=True).arm_values()
    platform.advance(AGGRESSIVE)  # nothing to live: no population
    after = platform.ab_test(1, 5, AdParams(), AdParams(), truth=True).arm_values()
    np.testing.assert_array_equal(before, after)
    assert platform.day is None


def test_stationary_world_reproduces_the_first_version():
    """The first version's numbers (main at b3c5139, before the live world), exactly."""
    platform = AdPlatform(0)
    users = platform.eval_users(300)
    assert platform.value(AdParams(), users) == 15.203014577358262
    aggressive = AdParams(
        ad_load=0.3, quality_weight=0.1, exploration_rate=0.2, frequency_cap=2.0, pacing_rate=0.7
    )
    # to 1e-9, not bitwise: numpy's SIMD kernels differ between CPUs (about 1e-14 here)
    assert platform.value(aggressive, users) == pytest.approx(14.569340102697655, rel=1e-9)
    e = platform.ab_test(5, 3, AdParams(), AdParams(ad_load=0.2), truth=True)
    assert e.effect == pytest.approx(0.20033380901669062, rel=1e-9)


def test_the_slow_state_is_invisible_on_day_1_and_costs_later():
    rng = np.random.default_rng(0)
    users, ads = make_users(600, rng), make_advertisers(20, rng)
    live, stat = run(users, ads, AGGRESSIVE, 30, LIVE), run(users, ads, AGGRESSIVE, 30, STATIONARY)
    np.testing.assert_array_equal(
        live.daily_value[0], stat.daily_value[0]
    )  # a day-1 A/B sees no difference
    # aggressive beats mild on day 1 but its daily value falls below mild's within the
    # week (measured 4.72 vs 2.80 on day 1, 1.47 vs 2.58 on day 7), and over 30 days it is
    # worth about a third (24.9 vs 71.6 per user)
    mild = run(users, ads, MILD, 30, LIVE)
    ratio = live.daily_value.mean(1) / mild.daily_value.mean(1)
    assert ratio[0] > 1.5 and ratio[6] < 0.7
    assert live.value.mean() < 0.5 * mild.value.mean()


def test_arrivals_drift_and_the_live_mix_moves():
    shares = np.array([arrival_shares(d) for d in range(80)])
    np.testing.assert_allclose(shares.sum(1), 1.0)
    assert np.abs(shares - SHARES).sum(1).max() > 0.3  # the arrivals' mix moves ...
    assert np.abs(shares[0] - shares[40]).sum() > 0.3  # ... and differs half a period apart
    platform = _lived(AdParams(), 40)
    first, last = platform.live.records[0]["shares"], platform.live.records[-1]["shares"]
    assert np.abs(np.array(first) - np.array(last)).sum() > 0.1


def test_per_population_parameters_act_on_their_population():
    rng = np.random.default_rng(1)
    users, ads = make_users(800, rng), make_advertisers(20, rng)
    base = simulate_day(users, ads, AdParams(), UserState.fresh(800))
    for name, value, field in (
        ("ad_load_loyal", 1.8, "impressions"),
        ("reminders_casual", 1.0, "items"),
    ):
        day = simulate_day(users, ads, AdParams(**{name: value}), UserState.fresh(800))
        target = users.population == POP_WORDS.index(name.split("_")[-1])
        change = np.abs(getattr(day, field) - getattr(base, field))
        # other populations move only through the advertisers' shared budgets
        assert change[target].mean() > 10 * change[~target].mean(), name
        assert change[target].mean() > 0.5, name
    # the first slot's items depend on each user's own state and population only
    day = simulate_day(users, ads, AdParams(reminders_casual=1.0), UserState.fresh(800))
    others = users.population != POP_WORDS.index("casual")
    np.testing.assert_array_equal(day.slot_items[0, others], base.slot_items[0, others])


def test_live_world_is_deterministic_by_seed():
    def trial(seed: int) -> tuple[np.ndarray, np.ndarray]:
        platform = _lived(AGGRESSIVE, 4, seed)
        exps = platform.multi_arm_test(7, 4, AdParams(), [MILD], truth=True)
        return exps[0].arms[1].pop_signals, exps[0].pop_values

    a, b, c = trial(3), trial(3), trial(4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])


def test_live_experiments_must_run_on_the_platform_day():
    platform = _lived(AdParams(), 2)
    with pytest.raises(ValueError, match="at day 2"):
        platform.ab_test(1, 5, AdParams(), MILD)


def test_live_history_follows_the_offline_schedule_and_burn_in_matches_it():
    a = AdPlatform(2, users_per_arm=40, world="live", live_users=600)
    history = make_history(a, 12, per_day=2, seed=2)
    assert [e.start_day for e in history] == [k // 2 for k in range(12)]
    assert all(e.control == offline_control(2, e.start_day) for e in history)
    b = AdPlatform(2, users_per_arm=40, world="live", live_users=600)
    burn_in(b, 6)
    assert a.day == b.day == 6
    np.testing.assert_array_equal(a.live.state.sat, b.live.state.sat)
    np.testing.assert_array_equal(a.live.users.population, b.live.users.population)


def test_the_level_grid_is_too_large_to_search():
    assert len(NAMES) == 14
    assert LEVEL_GRID_SIZE == 5**14 == 6_103_515_625
    assert DISTINCT_CONFIGURATIONS == 26_244_000_000  # with the defaults that are no level


def test_large_search_finds_a_separable_optimum_within_its_budget():
    target = {n: OPTIONS[n][-2] for n in NAMES}  # the optimum: each parameter's "high"

    def value(p: AdParams) -> float:
        v = p.vector()
        return -float(sum((v[i] - target[n]) ** 2 for i, n in enumerate(NAMES)))

    result = large_search(value, budget=400, seed=0)
    assert result.evaluations <= 400
    assert result.best == pytest.approx(target)
    assert result.trace == sorted(result.trace)  # the best so far never falls
