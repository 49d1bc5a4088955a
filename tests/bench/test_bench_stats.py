"""bench's paired ratios: 95% interval by hand, and rounds repeated until it is narrow."""

import math

import pytest

from policyopt.bench.stats import ratio_interval, repeat_until_narrow


def test_interval_by_hand():
    # ratios 1.0, 1.1, 0.9, 1.0: mean 1.0, s = sqrt(0.02 / 3) = 0.0816497, se = s / 2,
    # t_{0.975,3} = 3.18245 (tables) -> half width 0.1299067
    iv = ratio_interval([1.0, 1.1, 0.9, 1.0])
    half = 3.18245 * math.sqrt(0.02 / 3) / 2
    assert iv["mean"] == pytest.approx(1.0)
    assert iv["low"] == pytest.approx(1.0 - half, abs=1e-5)
    assert iv["high"] == pytest.approx(1.0 + half, abs=1e-5)
    assert iv["width"] == pytest.approx(2 * half, abs=1e-5)
    assert iv["n"] == 4
    with pytest.raises(ValueError, match="at least 2 paired rounds"):
        ratio_interval([1.0])


def synthetic(values):
    """A bench whose round i gives arm 'b' the ratio values[i] to arm 'a'."""
    seen = []

    def run_round(i):
        seen.append(values[i])

    return seen, run_round, lambda: {"b": list(seen)}


def test_stops_as_soon_as_the_interval_is_narrow():
    # Alternating 1.00, 1.02: width after n rounds = 2 t s / sqrt(n), s about 0.0107;
    # n = 4: 2 * 3.182 * 0.011547 / 2 = 0.0367 > 0.03; n = 5: 2 * 2.776 * 0.010954 / 2.236
    # = 0.0272 <= 0.03 -> stops after 5.
    seen, run_round, ratios = synthetic([1.0, 1.02] * 50)
    out = repeat_until_narrow(run_round, ratios, width=0.03, min_rounds=3, max_rounds=40)
    assert len(seen) == 5
    assert out["b"]["converged"] is True
    assert out["b"]["width"] == pytest.approx(2 * 2.776 * 0.0109545 / math.sqrt(5), rel=3e-4)
    assert out["b"]["mean"] == pytest.approx(1.008)


def test_gives_up_at_max_rounds_and_says_so():
    # 0.97, 1.05, 1.13 repeating (the three quiet HISPO runs): far too spread for 0.03 in 9.
    seen, run_round, ratios = synthetic([0.97, 1.05, 1.13] * 10)
    out = repeat_until_narrow(run_round, ratios, width=0.03, min_rounds=3, max_rounds=9)
    assert len(seen) == 9
    assert out["b"]["converged"] is False
    assert out["b"]["n"] == 9
    assert out["b"]["width"] > 0.03


def test_min_rounds_and_bad_settings():
    seen, run_round, ratios = synthetic([1.0] * 10)  # zero spread: narrow at once
    repeat_until_narrow(run_round, ratios, width=0.03, min_rounds=4, max_rounds=10)
    assert len(seen) == 4
    with pytest.raises(ValueError, match="positive"):
        repeat_until_narrow(run_round, ratios, width=0, min_rounds=2, max_rounds=3)
    with pytest.raises(ValueError, match="2 <= min"):
        repeat_until_narrow(run_round, ratios, width=0.1, min_rounds=5, max_rounds=3)
