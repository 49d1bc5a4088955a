"""Mechanism metrics against hand-worked numbers."""

import math

import pytest
import torch

from policyopt.core.diagnostics import ratio_diagnostics, rollout_diagnostics


def test_ratio_metrics_by_hand():
    # Response 0: token ratios 1.5, 1.0, 1.0 (segments {0}, {1, 2}); response 1: 0.5, pad.
    ratios = torch.tensor([[1.5, 1.0, 1.0], [0.5, 1.0, 1.0]], dtype=torch.float64)
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = ratios.log()
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    segs = torch.tensor([[0, 1, 1], [0, 0, 0]])
    m = ratio_diagnostics(logp, old, mask, segs, eps=0.2)
    valid = [1.5, 1.0, 1.0, 0.5]
    mean = sum(valid) / 4
    assert m["mech/ratio_mean"] == pytest.approx(mean)
    assert m["mech/ratio_std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in valid) / 4))
    k3 = [r - 1 - math.log(r) for r in valid]
    assert m["mech/kl_old_new"] == pytest.approx(sum(k3) / 4)
    assert m["mech/clip_frac/token"] == pytest.approx(2 / 4)  # 1.5 and 0.5
    # Sequence ratios: (1.5 * 1 * 1)^(1/3) = 1.145 (inside), 0.5 (outside): 1 of 2.
    assert m["mech/clip_frac/sequence"] == pytest.approx(1 / 2)
    # Segment ratios: 1.5 (out), 1.0 (in), 0.5 (out): 2 of 3.
    assert m["mech/clip_frac/segment"] == pytest.approx(2 / 3)
    # On-policy: ratio exactly 1, nothing clipped, KL 0.
    same = ratio_diagnostics(logp, logp, mask, segs)
    assert same["mech/ratio_std"] == 0 and same["mech/kl_old_new"] == 0
    assert same["mech/clip_frac/token"] == same["mech/clip_frac/segment"] == 0
    with pytest.raises(ValueError, match="eps"):
        ratio_diagnostics(logp, old, mask, eps=0)


def test_one_segment_is_the_sequence_level_one_token_segments_the_token_level():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(5, 7, generator=g) * 0.3
    old = torch.zeros(5, 7)
    mask = torch.ones(5, 7)
    one = ratio_diagnostics(logp, old, mask, torch.zeros(5, 7, dtype=torch.long))
    assert one["mech/clip_frac/segment"] == pytest.approx(one["mech/clip_frac/sequence"])
    each = ratio_diagnostics(logp, old, mask, torch.arange(7).expand(5, 7))
    assert each["mech/clip_frac/segment"] == pytest.approx(each["mech/clip_frac/token"])


def test_rollout_metrics_by_hand():
    entropy = torch.tensor([[1.0, 3.0, 9.0], [2.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    segs = torch.tensor([[0, 1, 1], [0, 0, 0]])
    groups = torch.tensor([0, 0, 1, 1])
    m = rollout_diagnostics(
        torch.cat([entropy, entropy]),
        torch.cat([mask, mask]),
        groups,
        correct=[True, True, True, False],
        answers=["1+2", "1+2", "2+1", "2+1"],
        segment_ids=torch.cat([segs, segs]),
    )
    assert m["mech/entropy"] == pytest.approx((1 + 3 + 2) * 2 / 6)
    assert m["mech/segments_per_response"] == pytest.approx((2 + 1 + 2 + 1) / 4)
    # Group 0: one distinct correct answer ("1+2" twice); group 1: one.
    assert m["mech/distinct_correct"] == pytest.approx(1.0)
    m2 = rollout_diagnostics(entropy, mask, torch.tensor([0, 0]), [True, True], ["a", "b"])
    assert m2["mech/distinct_correct"] == 2.0 and "mech/segments_per_response" not in m2
    assert "mech/entropy" not in rollout_diagnostics(None, mask, torch.tensor([0, 0]), [0, 0], [])
