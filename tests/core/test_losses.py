"""Policy losses: clipping cases by hand, GSPO ratios, metrics, micro-batch invariance."""

import math

import pytest
import torch

from loss_helpers import policy_loss
from policyopt.core import AGG_MODES, POLICY_LOSSES, global_normalisers

torch.set_num_threads(1)
F64 = torch.float64


def logp_for(ratios):
    """logp (requires grad) and old_logp = 0 with exp(logp − old_logp) = the given ratios."""
    logp = torch.tensor([ratios], dtype=F64).log().requires_grad_()
    return logp, torch.zeros_like(logp)


def test_ppo_clip_cases_by_hand():
    # ε = 0.2, token-mean over 5 tokens. Per token (ρ, Â) -> loss −min(ρÂ, clip(ρ)Â):
    #  a (1.1, +1) inside          -> −1.1, grad −Âρ/5 = −0.22
    #  b (1.5, +1) high clip       -> −min(1.5, 1.2) = −1.2, grad 0
    #  c (0.5, +1) below, Â > 0    -> −min(0.5, 0.8) = −0.5, grad −0.1 (not clipped)
    #  d (0.5, −1) low clip        -> −min(−0.5, −0.8) = 0.8, grad 0
    #  e (1.5, −1) above, Â < 0    -> −min(−1.5, −1.2) = 1.5, grad +0.3 (not clipped)
    # loss = (−1.1 − 1.2 − 0.5 + 0.8 + 1.5)/5 = −0.1
    logp, old = logp_for([1.1, 1.5, 0.5, 0.5, 1.5])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0]], dtype=F64)
    loss, m = policy_loss("ppo_clip", logp, old, adv, torch.ones(1, 5))
    loss.backward()
    assert loss.item() == pytest.approx(-0.1)
    assert torch.allclose(logp.grad, torch.tensor([[-0.22, 0.0, -0.1, 0.0, 0.3]], dtype=F64))
    # clip fractions: only d is low-clipped, only b high-clipped (c, e are outside the range
    # but on the unclipped side of the min) -> 1/5 each.
    assert m["clipfrac_low"] == pytest.approx(0.2)
    assert m["clipfrac_high"] == pytest.approx(0.2)
    assert (m["ratio_min"], m["ratio_max"]) == pytest.approx((0.5, 1.5))
    assert m["ratio_mean"] == pytest.approx(5.1 / 5)
    # approx_kl = mean of ρ − 1 − log ρ: 0.0046898 + 2·0.0945349 + 2·0.1931472 = 0.5800540
    assert m["approx_kl"] == pytest.approx(0.5800540 / 5, abs=1e-7)
    assert all(isinstance(v, float) for v in m.values())


def test_clip_higher_dapo():
    # ρ = 1.25, Â = +1: ε_high 0.2 caps at −1.2; DAPO's ε_high 0.28 leaves −1.25.
    logp, old = logp_for([1.25])
    adv = torch.ones(1, dtype=F64)
    default, _ = policy_loss("ppo_clip", logp, old, adv, torch.ones(1, 1))
    dapo, _ = policy_loss(
        "ppo_clip", logp, old, adv, torch.ones(1, 1), clip_low=0.2, clip_high=0.28
    )
    assert default.item() == pytest.approx(-1.2)
    assert dapo.item() == pytest.approx(-1.25)


def test_dual_clip_caps_negative_advantage_loss():
    # ρ = 5, Â = −1: plain loss −min(−5, −1.2) = 5; dual clip c = 3 caps at −cÂ = 3.
    # ρ = 5, Â = +1: −1.2 either way. token-mean: (3 − 1.2)/2 = 0.9 vs (5 − 1.2)/2 = 1.9
    logp, old = logp_for([5.0, 5.0])
    adv = torch.tensor([[-1.0, 1.0]], dtype=F64)
    mask = torch.ones(1, 2)
    plain, _ = policy_loss("ppo_clip", logp, old, adv, mask)
    dual, _ = policy_loss("ppo_clip", logp, old, adv, mask, clip_ratio_c=3.0)
    assert plain.item() == pytest.approx(1.9)
    assert dual.item() == pytest.approx(0.9)


def test_sequence_advantages_broadcast_over_tokens():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g, dtype=F64)
    old = logp + 0.3 * torch.randn(3, 4, generator=g, dtype=F64)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    a, _ = policy_loss("ppo_clip", logp, old, adv, mask, agg="seq-mean-token-mean")
    b, _ = policy_loss(
        "ppo_clip", logp, old, adv[:, None].expand(3, 4), mask, agg="seq-mean-token-mean"
    )
    assert torch.allclose(a, b)


def test_gspo_sequence_ratio_is_geometric_mean_of_token_ratios():
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(3, 5, generator=g, dtype=F64)
    old = logp + 0.1 * torch.randn(3, 5, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    _, m = policy_loss("gspo", logp, old, torch.zeros(3, dtype=F64), mask)
    # s_i = (Π_t π/π_old)^(1/T_i) computed directly from probabilities
    s = []
    for i in range(3):
        valid = mask[i].bool()
        ratios = logp[i][valid].exp() / old[i][valid].exp()
        s.append(math.prod(ratios.tolist()) ** (1 / int(valid.sum())))
    assert m["ratio_min"] == pytest.approx(min(s), rel=1e-12)
    assert m["ratio_max"] == pytest.approx(max(s), rel=1e-12)
    assert m["ratio_mean"] == pytest.approx(sum(s) / 3, rel=1e-12)


def test_gspo_clipping_by_hand():
    # ε_low 3e-4, ε_high 4e-4. Per sequence (log ratios on valid tokens, Â):
    #  0: [1e-4, 3e-4], +1 -> s = e^2e-4 = 1.000200020 inside -> −1.000200020, grads −s/(2·4)
    #  1: [1e-3]·3,     +1 -> s = e^1e-3 > 1.0004 high clip -> −1.0004, grad 0
    #  2: [−2e-3],      −1 -> s = 0.998002 < 0.9997 low clip -> +0.9997, grad 0
    #  3: [1e-4],       −1 -> s = e^1e-4 = 1.000100005 inside -> +1.000100005, grad +s/(1·4)
    # loss = (−1.000200020 − 1.0004 + 0.9997 + 1.000100005)/4
    log_ratio = torch.tensor(
        [[1e-4, 3e-4, 0.0], [1e-3, 1e-3, 1e-3], [-2e-3, 0.0, 0.0], [1e-4, 0.0, 0.0]], dtype=F64
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 0, 0]])
    old = torch.full((4, 3), -1.0, dtype=F64)
    logp = (old + log_ratio).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=F64)
    loss, m = policy_loss("gspo", logp, old, adv, mask)
    loss.backward()
    s0, s3 = math.exp(2e-4), math.exp(1e-4)
    assert loss.item() == pytest.approx((-s0 - 1.0004 + 0.9997 + s3) / 4, rel=1e-12)
    expected_grad = torch.tensor(
        [[-s0 / 8, -s0 / 8, 0], [0, 0, 0], [0, 0, 0], [s3 / 4, 0, 0]], dtype=F64
    )
    assert torch.allclose(logp.grad, expected_grad, rtol=1e-12)
    # clip fractions over the 7 valid tokens: seq 2 (1 token) low, seq 1 (3 tokens) high
    assert m["clipfrac_low"] == pytest.approx(1 / 7)
    assert m["clipfrac_high"] == pytest.approx(3 / 7)


def _random_batch(seed, scale=1e-3, n=8, width=10):
    """8 sequences of lengths 10, 3, 0, 7, 1, 5, 9, 2; log ratios ~ scale · N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, width, generator=g, dtype=F64) * 3
    logp = old + scale * torch.randn(n, width, generator=g, dtype=F64)
    lengths = torch.tensor([10, 3, 0, 7, 1, 5, 9, 2])[:n]
    mask = torch.arange(width)[None, :] < lengths[:, None]
    adv = torch.randn(n, generator=g, dtype=F64)
    return logp, old, adv, mask


def test_gspo_token_variant_equals_seq_variant_for_sequence_advantages():
    logp, old, adv, mask = _random_batch(2)
    results = []
    for variant in ("seq", "token"):
        x = logp.clone().requires_grad_()
        loss, m = policy_loss("gspo", x, old, adv, mask, variant=variant)
        (grad,) = torch.autograd.grad(loss, x)
        results.append((loss, grad, m))
    (l_seq, g_seq, m_seq), (l_tok, g_tok, m_tok) = results
    assert 0 < m_seq["clipfrac_low"] + m_seq["clipfrac_high"] < 1  # both branches exercised
    assert torch.allclose(l_seq, l_tok, rtol=1e-12)
    assert torch.allclose(g_seq, g_tok, rtol=1e-12, atol=1e-15)
    assert m_seq == pytest.approx(m_tok)


def test_gspo_token_variant_per_token_advantages_by_hand():
    # One sequence, 2 tokens, log ratios [1e-4, −1e-4] -> s = 1 (inside), Â_t = [+1, −1]:
    # per-token loss [−s, +s] -> mean 0; grad_t = −Â_t · s / T = [−0.5, +0.5]
    # (the seq variant cannot take per-token advantages at all).
    old = torch.zeros(1, 2, dtype=F64)
    logp = torch.tensor([[1e-4, -1e-4]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]], dtype=F64)
    loss, _ = policy_loss("gspo", logp, old, adv, torch.ones(1, 2), variant="token")
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-15)
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 0.5]], dtype=F64))
    with pytest.raises(ValueError, match="need variant='token'"):
        policy_loss("gspo", logp, old, adv, torch.ones(1, 2))


CASES = [("ppo_clip", {"agg": mode}) for mode in AGG_MODES] + [
    ("gspo", {"variant": "seq"}),
    ("gspo", {"variant": "token"}),
]


@pytest.mark.parametrize(("name", "opts"), CASES)
def test_micro_batch_sum_equals_full_batch(name, opts):
    # log-ratio scale: PPO's ε = 0.2 and GSPO's 3e-4/4e-4 each clip some of the batch
    logp, old, adv, mask = _random_batch(3, scale=0.3 if name == "ppo_clip" else 1e-3)
    tokens, seqs = global_normalisers(mask)
    norms = {"global_tokens": tokens, "global_seqs": seqs, "max_len": 12}

    x = logp.clone().requires_grad_()
    full, m = policy_loss(name, x, old, adv, mask, **opts, **norms)
    (full_grad,) = torch.autograd.grad(full, x)
    assert 0 < m["clipfrac_low"] + m["clipfrac_high"] < 1

    x = logp.clone().requires_grad_()
    total = torch.zeros((), dtype=F64)
    for rows in (slice(0, 3), slice(3, 6), slice(6, 8)):
        part, _ = policy_loss(name, x[rows], old[rows], adv[rows], mask[rows], **opts, **norms)
        total = total + part
    (split_grad,) = torch.autograd.grad(total, x)

    assert full.item() != 0.0
    assert torch.allclose(total, full, rtol=1e-12, atol=1e-14)
    assert torch.allclose(split_grad, full_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo"])
def test_nan_padding_does_not_leak(name):
    logp, old, adv, mask = _random_batch(4)
    logp = logp.masked_fill(~mask, float("nan")).requires_grad_()
    old = old.masked_fill(~mask, float("nan"))
    loss, m = policy_loss(name, logp, old, adv, mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert (logp.grad[~mask] == 0).all()
    assert all(math.isfinite(v) for v in m.values())


def test_half_precision_inputs_give_float32_loss():
    logp, old = logp_for([1.1, 0.9])
    loss, _ = policy_loss(
        "ppo_clip", logp.bfloat16(), old.bfloat16(), torch.ones(1).bfloat16(), torch.ones(1, 2)
    )
    assert loss.dtype == torch.float32


def test_errors_name_the_problem():
    logp, old = logp_for([1.0, 1.0])
    adv, mask = torch.ones(1, dtype=F64), torch.ones(1, 2)
    with pytest.raises(KeyError, match="valid names: .*gspo.*ppo_clip"):
        policy_loss("ppo", logp, old, adv, mask)
    with pytest.raises(
        TypeError, match="'eps'.*valid options: .*clip_low, clip_high, clip_ratio_c"
    ):
        policy_loss("ppo_clip", logp, old, adv, mask, eps=0.2)
    with pytest.raises(ValueError, match=r"advantages must have shape \[N\] = \(1,\)"):
        policy_loss("ppo_clip", logp, old, torch.ones(2), mask)
    with pytest.raises(ValueError, match="old_logp must have logp's shape"):
        policy_loss("ppo_clip", logp, old[:, :1], adv, mask)
    with pytest.raises(ValueError, match="clip_low must be in"):
        policy_loss("ppo_clip", logp, old, adv, mask, clip_low=1.5)
    with pytest.raises(ValueError, match="clip_ratio_c must be greater than 1"):
        policy_loss("ppo_clip", logp, old, adv, mask, clip_ratio_c=0.5)
    with pytest.raises(ValueError, match="gspo variant must be"):
        policy_loss("gspo", logp, old, adv, mask, variant="segment")
    assert set(POLICY_LOSSES.names()) >= {"ppo_clip", "gspo"}
