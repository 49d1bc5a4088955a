"""The outlier study's metrics by hand, and one outlier's effect on GRPO and DRPO."""

from __future__ import annotations

import numpy as np
import pytest
from studies.dmrl.robustness import R0, advantages, clean_metrics


def test_clean_metrics_by_hand():
    adv = np.array([1.0, -1.0, 2.0, 0.5])
    lift = np.array([0.1, -0.1, 0.3, 0.0])
    m = clean_metrics(adv, lift, np.array([True, True, True, False]))
    # clean lifts (.1, -.1, .3): median .1, targets (0, -1, +1): both signs right
    assert m["sign_accuracy"] == 1.0 and m["order_accuracy"] == 1.0
    assert m["signal_share"] == pytest.approx(4.0 / 4.5)
    assert m["clean_std"] == pytest.approx(np.std([1.0, -1.0, 2.0]))


def test_one_big_outlier_flips_grpo_signs_not_drpo():
    # seven clean lifts and one +50% outlier: GRPO's mean sits above every clean reward,
    # so every clean edit is pushed down; the median keeps the better half positive.
    lift = np.array([-0.03, -0.02, -0.01, 0.0, 0.01, 0.02, 0.03, 0.0])
    rewards = R0 * (1 + lift)
    rewards[-1] = R0 * 1.5
    clean = np.arange(8) < 7
    g = clean_metrics(advantages(rewards, "grpo"), lift, clean)
    d = clean_metrics(advantages(rewards, "drpo"), lift, clean)
    assert g["sign_accuracy"] == 0.5 and d["sign_accuracy"] == 1.0
    assert g["order_accuracy"] == d["order_accuracy"] == 1.0  # order: affine in R either way
