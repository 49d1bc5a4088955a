"""The day-1 vs long-term tension study's arithmetic (`recipes/dmrl_tension.py`)."""

from __future__ import annotations

import numpy as np
import pytest
from studies.dmrl.tension import tension


def test_tension_spearman_and_regret_of_choosing_by_day_1():
    d1 = np.array([3.0, 2.0, 1.0])
    d7 = np.array([1.0, 2.0, 4.0])  # the best day-1 configuration is the worst at 7 days
    d30 = np.array([2.0, 1.0, 0.5])  # ... but the best at 30
    t = tension(d1, d7, d30)
    assert t["spearman_1_7"] == pytest.approx(-1.0)
    assert t["spearman_1_30"] == pytest.approx(1.0)
    assert t["regret_7"] == pytest.approx(1 - 1.0 / 4.0)
    assert t["regret_30"] == 0.0
