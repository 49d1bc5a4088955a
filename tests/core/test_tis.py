"""Truncated importance sampling weights, worked by hand."""

import math

import pytest
import torch

from policyopt.core import compute_policy_loss
from policyopt.core.tis import sequence_tis_weights, tis_weights


def test_token_weights_by_hand() -> None:
    # π_old / π_sampler per token: 0.5/0.25 = 2 -> 2; 0.9/0.3 = 3 -> capped at 2;
    # 0.2/0.4 = 0.5; 0.6/0.6 = 1; the last position is padding.
    old = torch.tensor([[0.5, 0.9, 0.2], [0.6, 0.1, 0.1]]).log()
    sampler = torch.tensor([[0.25, 0.3, 0.4], [0.6, 0.7, 0.7]]).log()
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w = tis_weights(old, sampler, mask, cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 0.5], [1.0, 0.0, 0.0]]), atol=1e-6)
    assert not w.requires_grad


def test_sequence_weights_are_the_capped_geometric_mean() -> None:
    old = torch.tensor([[0.5, 0.2, 0.3], [0.9, 0.9, 0.0]]).log()
    sampler = torch.tensor([[0.25, 0.4, 0.3], [0.1, 0.1, 0.5]]).log()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w = sequence_tis_weights(old, sampler, mask, cap=2.0)
    # Row 0: (2 * 0.5 * 1)^(1/3) = 1; row 1: (9 * 9)^(1/2) = 9 -> 2.
    assert torch.allclose(w, torch.tensor([1.0, 2.0]), atol=1e-6)
    assert sequence_tis_weights(old, sampler, mask, cap=10.0)[1].item() == pytest.approx(9.0)


def test_weighting_the_advantage_weights_the_ppo_token_loss() -> None:
    # The weight enters PPO's clipped surrogate linearly: with Â w per token the loss equals
    # the token-mean of w_t ℓ_t, ℓ_t = −min(ρÂ, clip(ρ)Â) worked by hand.
    logp = torch.tensor([[math.log(0.5), math.log(0.9)]])
    old = torch.tensor([[math.log(0.4), math.log(0.6)]])
    w = torch.tensor([[2.0, 0.5]])
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 2)
    loss, _ = compute_policy_loss(
        "ppo_clip",
        logp,
        old,
        adv[:, None] * w,
        mask,
        agg="token-mean",
        clip_low=0.2,
        clip_high=0.2,
    )
    # ρ = 1.25 (within 1.2? no: clipped to 1.2) and 1.5 (clipped to 1.2); Â > 0 so the min
    # takes the clipped values: ℓ = −1.2 each; weighted mean = (2 * −1.2 + 0.5 * −1.2) / 2.
    assert loss.item() == pytest.approx((2.0 * -1.2 + 0.5 * -1.2) / 2)


def test_bad_input_is_named() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="cap C must be > 0"):
        tis_weights(x, x, x, cap=0.0)
    with pytest.raises(ValueError, match="one shape"):
        tis_weights(x, torch.zeros(2, 2), x, cap=2.0)


def test_update_weights_advantages_per_token_or_per_sequence() -> None:
    from policyopt.trainer.trainer import resolve_tis_cap
    from policyopt.trainer.update import tis_advantages

    old = torch.tensor([[0.5, 0.9], [0.2, 0.2]]).log()
    sampler = torch.tensor([[0.25, 0.3], [0.4, 0.1]]).log()
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    per_token, mean = tis_advantages(adv, old, sampler, mask, 2.0, sequence_level=False)
    # Weights [[2, 3 -> 2], [0.5, padding 0]].
    assert torch.allclose(per_token, torch.tensor([[2.0, 2.0], [-1.0, 0.0]]))
    assert mean == pytest.approx((2 + 2 + 0.5) / 3)
    per_seq, mean = tis_advantages(adv, old, sampler, mask, 2.0, sequence_level=True)
    # Row 0: sqrt(2 * 3) = 2.449 -> 2; row 1: 0.5.
    assert torch.allclose(per_seq, torch.tensor([2.0, -1.0]))
    assert resolve_tis_cap("auto", exact_logprobs=True) is None
    assert resolve_tis_cap("auto", exact_logprobs=False) == 2.0
    assert resolve_tis_cap(3, exact_logprobs=True) == 3.0
    assert resolve_tis_cap(None, exact_logprobs=False) is None
