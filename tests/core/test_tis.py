"""Truncated importance sampling weights, worked by hand."""

import math

import pytest
import torch

from policyopt.core import compute_policy_loss
from policyopt.core.losses import LossInputs
from policyopt.core.tis import ISWeights, sequence_tis_weights, tis_weights


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


def test_the_token_clip_weights_each_token_loss() -> None:
    # ppo_clip applies w per token to ℓ_t = −min(ρÂ, clip(ρ)Â), worked by hand.
    logp = torch.tensor([[math.log(0.5), math.log(0.9)]])
    old = torch.tensor([[math.log(0.4), math.log(0.6)]])
    w = ISWeights(token=torch.tensor([[2.0, 0.5]]), sequence=torch.tensor([7.0]))
    inputs = LossInputs(logp, old, torch.tensor([1.0]), torch.ones(1, 2), is_weights=w)
    loss, metrics = compute_policy_loss(
        "ppo_clip", inputs, agg="token-mean", clip_low=0.2, clip_high=0.2
    )
    # ρ = 1.25 and 1.5, both clipped to 1.2; Â > 0 so the min takes the clipped values:
    # ℓ = −1.2 each; weighted mean = (2 * −1.2 + 0.5 * −1.2) / 2 (the sequence weight unused).
    assert loss.item() == pytest.approx((2.0 * -1.2 + 0.5 * -1.2) / 2)
    assert metrics["tis_weight_mean"] == pytest.approx(1.25)


def test_bad_input_is_named() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="cap C must be > 0"):
        tis_weights(x, x, x, cap=0.0)
    with pytest.raises(ValueError, match="one shape"):
        tis_weights(x, torch.zeros(2, 2), x, cap=2.0)


def test_each_loss_applies_the_weights_at_its_own_level() -> None:
    """Weights computed once at both levels; ppo_clip and gspo-token take the token level,
    gspo (seq) and hispo the sequence level (as verl's losses take rollout_is_weights)."""
    from policyopt.train.trainer import resolve_tis_cap

    old = torch.tensor([[0.5, 0.9], [0.2, 0.2]]).log()
    sampler = torch.tensor([[0.25, 0.3], [0.4, 0.1]]).log()
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    w = ISWeights.of(old, sampler, mask, 2.0)
    # Token weights [[2, 3 -> 2], [0.5, padding 0]]; sequence: sqrt(2 * 3) = 2.449 -> 2, 0.5.
    assert torch.allclose(w.token, torch.tensor([[2.0, 2.0], [0.5, 0.0]]))
    assert torch.allclose(w.sequence, torch.tensor([2.0, 0.5]))
    assert w.token_mean(mask) == pytest.approx((2 + 2 + 0.5) / 3)
    assert w.sequence_mean() == pytest.approx(1.25)
    # On-policy (logp = old): every ratio is 1, so ℓ = −Â times the weight of its level.
    on_policy = LossInputs(old, old, adv, mask, is_weights=w)
    ppo, m = compute_policy_loss("ppo_clip", on_policy, agg="token-mean")
    assert ppo.item() == pytest.approx((-2.0 - 2.0 + 2.0 * 0.5) / 3)  # token-mean of −Â w_t
    assert m["tis_weight_mean"] == pytest.approx(1.5)
    gspo, m = compute_policy_loss("gspo", on_policy)
    assert gspo.item() == pytest.approx((-1.0 * 2.0 + 2.0 * 0.5) / 2)  # mean_i −Â_i w_i
    assert m["tis_weight_mean"] == pytest.approx(1.25)
    token, _ = compute_policy_loss("gspo", on_policy, variant="token")
    # seq-mean-token-mean of −Â w_t: row 0 mean(−2, −2), row 1 (+1) alone.
    assert token.item() == pytest.approx((-2.0 + 1.0) / 2)
    one_segment = {"segment_ids": torch.zeros(2, 2, dtype=torch.long), "entropies": mask * 0}
    hispo_inputs = LossInputs(old, old, adv, mask, is_weights=w, structure=one_segment)
    hispo, _ = compute_policy_loss("hispo", hispo_inputs, min_segment_len=1)
    assert hispo.item() == pytest.approx(gspo.item())  # one segment: GSPO's objective
    assert resolve_tis_cap("auto", exact_logprobs=True) is None
    assert resolve_tis_cap("auto", exact_logprobs=False) == 2.0
    assert resolve_tis_cap(3, exact_logprobs=True) == 3.0
    assert resolve_tis_cap(None, exact_logprobs=False) is None
