"""The ad-platform simulator and its A/B harness."""

from __future__ import annotations

import numpy as np
import pytest

from policyopt.envs.ads.adsim.abtest import HORIZON, AdPlatform
from policyopt.envs.ads.adsim.params import RANGES, AdParams
from policyopt.envs.ads.adsim.simulator import allocation, run
from policyopt.envs.ads.adsim.world import SHARES, make_advertisers, make_users


def test_deterministic_by_seed():
    a = AdPlatform(seed=3, users_per_arm=100).ab_test(5, 0, AdParams(), AdParams(ad_load=0.2), True)
    b = AdPlatform(seed=3, users_per_arm=100).ab_test(5, 0, AdParams(), AdParams(ad_load=0.2), True)
    c = AdPlatform(seed=4, users_per_arm=100).ab_test(5, 0, AdParams(), AdParams(ad_load=0.2), True)
    np.testing.assert_array_equal(a.arms[1].pop_signals, b.arms[1].pop_signals)
    np.testing.assert_array_equal(a.pop_values, b.pop_values)
    assert not np.array_equal(a.pop_values, c.pop_values)


def test_parameters_are_checked_against_their_ranges():
    with pytest.raises(ValueError, match=r"ad_load=0.5 is outside its range \[0.02, 0.3\]"):
        AdParams(ad_load=0.5)
    p = AdParams.clipped({"frequency_cap": 99.0, "quality_weight": -1.0})
    assert p.frequency_cap == RANGES["frequency_cap"][1] and p.quality_weight == 0.0
    assert AdParams.from_fractions({"pacing_rate": 1.0}).pacing_rate == 1.5


def test_population_shares():
    users = make_users(20000, np.random.default_rng(0))
    np.testing.assert_allclose(users.shares(), SHARES, atol=0.01)


def test_more_ad_load_raises_day1_revenue_but_costs_long_term_value_of_lt_high_users():
    rng = np.random.default_rng(0)
    users, ads = make_users(600, rng), make_advertisers(20, rng)
    low = run(users, ads, AdParams(ad_load=0.06, quality_weight=0.5))
    high = run(users, ads, AdParams(ad_load=0.30, quality_weight=0.5))
    assert high.day1.revenue.mean() > 1.5 * low.day1.revenue.mean()
    lt_high = np.isin(users.population, [1, 3])
    assert high.value[lt_high].mean() < low.value[lt_high].mean()
    # ... while short-term, low-long-term users are worth more with more ads
    st_only = users.population == 2
    assert high.value[st_only].mean() > low.value[st_only].mean()
    # the day-1 value understates the harm: its gain is larger than the 7-day one, relatively
    day1_gain = high.daily_value[0].mean() / low.daily_value[0].mean()
    week_gain = high.value.mean() / low.value.mean()
    assert day1_gain > week_gain


def test_allocation_is_a_distribution_with_exploration_floor():
    rng = np.random.default_rng(1)
    users, ads = make_users(50, rng), make_advertisers(10, rng)
    pi, _ = allocation(users, ads, AdParams(exploration_rate=0.2))
    np.testing.assert_allclose(pi.sum(1), 1.0)
    assert (pi >= 0.2 / 10 - 1e-12).all()


def test_ab_test_labels_and_maturity():
    platform = AdPlatform(seed=0, users_per_arm=120)
    e = platform.ab_test(7, 10, AdParams(), AdParams(ad_load=0.25), truth=True)
    assert e.matured_day == 10 + HORIZON
    v = e.arm_values()
    assert e.effect == pytest.approx(v[1] - v[0])
    assert e.arms[0].pop_counts.sum() == e.arms[1].pop_counts.sum() == 120
    without = platform.ab_test(7, 10, AdParams(), AdParams(ad_load=0.25))
    assert without.pop_values is None
    # the same users and counts whether or not the truth is computed
    np.testing.assert_array_equal(without.arms[1].pop_counts, e.arms[1].pop_counts)


def test_true_effect_is_causal_over_all_users():
    platform = AdPlatform(seed=1, users_per_arm=80)
    control, treatment = AdParams(), AdParams(ad_load=0.25, frequency_cap=2.0)
    assert platform.ab_test(3, 0, control, control, truth=True).effect == 0.0  # A/A
    e = platform.ab_test(3, 0, control, treatment, truth=True)
    _, users, _ = platform.traffic(3)  # the experiment's 160 users, both halves
    brute = (
        run(users, platform.ads, treatment).value.mean()
        - run(users, platform.ads, control).value.mean()
    )
    assert e.effect == pytest.approx(brute)


def test_stratified_arms_hold_equal_population_counts():
    from policyopt.envs.ads.adsim.abtest import stratified_arms

    pop = np.array([0] * 7 + [1] * 5 + [2] * 3 + [3] * 2)
    arm = stratified_arms(pop, 3, np.random.default_rng(0))
    counts = np.array([[np.sum((arm == a) & (pop == p)) for p in range(4)] for a in range(3)])
    assert (counts.max(0) - counts.min(0) <= 1).all()
    assert counts.sum(1).max() - counts.sum(1).min() <= 1  # the rotation balances arm sizes


def test_multi_arm_test_shares_one_control_and_is_deterministic():
    plat = AdPlatform(seed=2, users_per_arm=80)
    cands = [AdParams(ad_load=0.2), AdParams(quality_weight=0.9), AdParams()]
    exps = plat.multi_arm_test(9, 3, AdParams(), cands, truth=True)
    again = plat.multi_arm_test(9, 3, AdParams(), cands, truth=True)
    assert len(exps) == 3 and all(e.arms[0] is exps[0].arms[0] for e in exps)
    np.testing.assert_array_equal(exps[1].arms[1].pop_signals, again[1].arms[1].pop_signals)
    for e in exps:  # every arm has the same population counts (±1), 80 users each
        assert np.abs(e.arms[1].pop_counts - e.arms[0].pop_counts).max() <= 1
        assert e.arms[1].pop_counts.sum() == 80
    # the truth runs each configuration on all 4 x 80 users: an A/A arm's effect is 0
    assert exps[2].effect == 0.0 and exps[0].effect != 0.0
    np.testing.assert_array_equal(exps[0].pop_values[0], exps[1].pop_values[0])
