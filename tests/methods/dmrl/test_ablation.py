from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from policyopt.recipes.dmrl_ablation import VARIANTS, mean_ci95


def test_mean_ci95_matches_scipy_interval():
    values = [0.012, -0.004, 0.02]
    mean, half = mean_ci95(values)
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert mean == pytest.approx(np.mean(values))
    assert half == pytest.approx((hi - lo) / 2)
    assert math.isnan(mean_ci95([0.1])[1])


def test_variants_are_the_papers_table_4():
    assert set(VARIANTS) == {"drpo", "no_mad", "no_control", "no_edit_cost", "grpo"}
    assert VARIANTS["no_mad"]["algorithm.advantage_options"]["robust"] is False
    assert VARIANTS["no_control"]["algorithm.advantage_options"]["alpha"] == 1.0
    assert VARIANTS["no_edit_cost"]["algorithm.advantage_options"]["lambda_edit"] == 0.0
    assert VARIANTS["grpo"]["algorithm.advantage"] == "grpo"
