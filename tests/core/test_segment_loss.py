"""HISPO's segment loss: a hand example, GSPO / GRPO equivalences, an independent loop,
Table 1's gradient coefficient, micro-batch invariance, padding and errors."""

import math

import pytest
import torch

from loss_helpers import policy_loss
from policyopt.core import POLICY_LOSSES, global_normalisers

torch.set_num_threads(1)
F64 = torch.float64


def random_case(seed: int, n: int = 6, t: int = 10, scale: float = 0.3):
    """logp, old, adv [n], mask (ragged, one empty row), segment ids, entropies."""
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(n, t, generator=g, dtype=F64) * scale - 1.0
    old = logp + torch.randn(n, t, generator=g, dtype=F64) * scale
    adv = torch.randn(n, generator=g, dtype=F64)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    lengths[1] = 0  # a row without valid tokens (e.g. filtered out)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    starts = torch.rand(n, t, generator=g) < 0.3  # a boundary at t starts a new segment
    starts[:, 0] = False
    seg = starts.long().cumsum(-1)
    ent = torch.rand(n, t, generator=g, dtype=F64) * 3
    return logp, old, adv, mask, seg, ent


def direct_loss(logp, old, adv, mask, seg, ent, clip_low, clip_high, l_min, g=None):
    """SPEC section 2 steps 6-9, one response and one segment at a time."""
    total = torch.zeros((), dtype=F64)
    rows = 0
    for i in range(logp.shape[0]):
        ids = [int(s) for s, m in zip(seg[i], mask[i], strict=True) if m]
        if not ids:
            continue
        rows += 1
        segments = [
            [t for t in range(logp.shape[1]) if mask[i, t] and seg[i, t] == k]
            for k in sorted(set(ids))
        ]
        mean_h = torch.stack([ent[i, s].mean() for s in segments])
        w = torch.exp(mean_h) / torch.exp(mean_h).sum()  # softmax_k
        for k, s in enumerate(segments):
            mu = torch.exp((logp[i, s] - old[i, s]).mean())
            a_k = w[k] / max(len(s), l_min) * adv[i]
            total = total + len(s) * torch.minimum(
                mu * a_k, mu.clamp(1 - clip_low, 1 + clip_high) * a_k
            )
    return -total / (g if g is not None else max(rows, 1))


def hispo(logp, old, adv, mask, seg, ent, **opts):
    return policy_loss("hispo", logp, old, adv, mask, segment_ids=seg, entropies=ent, **opts)


def test_registered():
    assert "hispo" in POLICY_LOSSES


def test_hand_example():
    # One response, 3 tokens; segments {0, 1} and {2}; H = (1, 1, 2) -> H̄ = (1, 2),
    # w = (1, e) / (1 + e). log ρ = (0.1, −0.1, 0.2): μ_0 = 1, μ_1 = e^0.2 = 1.2214 > 1.2.
    logp = torch.tensor([[0.1, -0.1, 0.2]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=F64)
    seg, ent = torch.tensor([[0, 0, 1]]), torch.tensor([[1.0, 1.0, 2.0]], dtype=F64)
    adv, mask = torch.ones(1, dtype=F64), torch.ones(1, 3, dtype=torch.bool)
    w0, w1 = 1 / (1 + math.e), math.e / (1 + math.e)
    # L_min = 1: J = 2 · 1 · w0/2 + 1 · min(1.2214, 1.2) · w1 = w0 + 1.2 w1
    loss, m = hispo(logp, old, adv, mask, seg, ent, min_segment_len=1)
    assert loss.item() == pytest.approx(-(w0 + 1.2 * w1), rel=1e-12)
    assert m["segments_per_response"] == 2 and m["mean_segment_length"] == 1.5
    assert m["segment_clipfrac"] == 0.5
    assert m["ratio_max"] == pytest.approx(math.exp(0.2)) and m["ratio_min"] == pytest.approx(1.0)
    assert m["clipfrac_high"] == pytest.approx(1 / 3)  # the clipped segment's one token
    # dJ/dlog π: segment 0 unclipped, Â μ w / (G |S|) = w0 / 2 per token; segment 1 clipped
    (grad,) = torch.autograd.grad(-loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[w0 / 2, w0 / 2, 0.0]], dtype=F64))
    # L_min = 16 (default): Â_k = w_k / 16 · Â, J = 2 w0/16 + 1.2 w1/16
    loss, _ = hispo(logp, old, adv, mask, seg, ent)
    assert loss.item() == pytest.approx(-(2 * w0 + 1.2 * w1) / 16, rel=1e-12)


def test_one_segment_per_response_equals_gspo():
    logp, old, adv, mask, _, ent = random_case(0)
    # Move the sequence ratio of even rows out of the clip range in Â's direction.
    old = old - 0.3 * adv.sign()[:, None] * (torch.arange(len(adv)) % 2 == 0)[:, None]
    seg = torch.zeros_like(mask, dtype=torch.long)
    opts = {"clip_low": 0.2, "clip_high": 0.2}
    x = logp.clone().requires_grad_()
    # L_min ≤ |S| = T_i: |S| · w / |S| · Â = Â, the GSPO objective
    ours, m = hispo(x, old, adv, mask, seg, ent, min_segment_len=1, **opts)
    (g_ours,) = torch.autograd.grad(ours, x)
    x = logp.clone().requires_grad_()
    gspo, m_gspo = policy_loss("gspo", x, old, adv, mask, **opts)
    (g_gspo,) = torch.autograd.grad(gspo, x)
    torch.testing.assert_close(ours, gspo, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_ours, g_gspo, rtol=1e-12, atol=1e-14)
    assert 0 < m["segment_clipfrac"] < 1  # both branches are exercised
    for key in ("ratio_mean", "ratio_min", "ratio_max", "clipfrac_low", "clipfrac_high"):
        assert m[key] == pytest.approx(m_gspo[key], rel=1e-12), key
    assert m["segments_per_response"] == 1


def test_one_token_per_segment_gives_token_ratio_and_grpo():
    logp, old, adv, mask, _, _ = random_case(1)
    seg = torch.arange(mask.shape[1]).expand_as(mask)
    ent = torch.ones_like(logp) * 0.7  # equal saliency: w = 1/T_i
    token_ratio = (logp - old).exp()[mask]
    x = logp.clone().requires_grad_()
    ours, m = hispo(x, old, adv, mask, seg, ent, min_segment_len=1)
    (g_ours,) = torch.autograd.grad(ours, x)
    assert m["ratio_min"] == pytest.approx(token_ratio.min().item(), rel=1e-12)
    assert m["ratio_max"] == pytest.approx(token_ratio.max().item(), rel=1e-12)
    assert m["ratio_mean"] == pytest.approx(token_ratio.mean().item(), rel=1e-12)
    # Σ_t 1 · min(ρ_t Â/T_i, clip(ρ_t) Â/T_i) / G is GRPO's seq-mean-token-mean loss
    x = logp.clone().requires_grad_()
    grpo, m_grpo = policy_loss("ppo_clip", x, old, adv, mask, agg="seq-mean-token-mean")
    (g_grpo,) = torch.autograd.grad(grpo, x)
    torch.testing.assert_close(ours, grpo, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_ours, g_grpo, rtol=1e-12, atol=1e-14)
    assert m["clipfrac_high"] + m["clipfrac_low"] > 0
    assert m["clipfrac_high"] == pytest.approx(m_grpo["clipfrac_high"])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("l_min", [1, 3, 16])
def test_random_cases_match_a_direct_loop(seed, l_min):
    logp, old, adv, mask, seg, ent = random_case(seed + 10)
    opts = {"clip_low": 0.2, "clip_high": 0.28}
    x = logp.clone().requires_grad_()
    ours, m = hispo(x, old, adv, mask, seg, ent, min_segment_len=l_min, **opts)
    (g_ours,) = torch.autograd.grad(ours, x)
    x = logp.clone().requires_grad_()
    ref = direct_loss(x, old, adv, mask, seg, ent, 0.2, 0.28, l_min)
    (g_ref,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-14)
    assert ours.item() != 0.0
    n_seg = sum(len(set(seg[i][mask[i]].tolist())) for i in range(len(seg)))
    assert m["segments_per_response"] == pytest.approx(n_seg / int(mask.any(-1).sum()))
    assert m["mean_segment_length"] == pytest.approx(int(mask.sum()) / n_seg)


def test_gradient_coefficient_is_table_1():
    # Unclipped (small ratios, L_min = 1 ≤ |S|): ∂J/∂log π(y_t) = Â_i μ_{i,k} w_{i,k} / (G |S_k|)
    logp, old, adv, mask, seg, ent = random_case(3, scale=0.02)
    x = logp.clone().requires_grad_()
    loss, m = hispo(x, old, adv, mask, seg, ent, min_segment_len=1)
    assert m["segment_clipfrac"] == 0
    (grad,) = torch.autograd.grad(-loss, x)
    g_count = int(mask.any(-1).sum())
    expected = torch.zeros_like(logp)
    for i in range(len(seg)):
        ks = sorted(set(seg[i][mask[i]].tolist()))
        if not ks:
            continue
        mean_h = torch.tensor([ent[i][mask[i] & (seg[i] == k)].mean() for k in ks], dtype=F64)
        w = torch.softmax(mean_h, 0)
        for k, w_k in zip(ks, w, strict=True):
            s = mask[i] & (seg[i] == k)
            mu = (logp[i][s] - old[i][s]).mean().exp()
            expected[i][s] = adv[i] * mu * w_k / (g_count * int(s.sum()))
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)


def test_micro_batch_split_equals_full_batch():
    logp, old, adv, mask, seg, ent = random_case(4, n=8)
    _, seqs = global_normalisers(mask)
    x = logp.clone().requires_grad_()
    full, m = hispo(x, old, adv, mask, seg, ent, global_seqs=seqs)
    (g_full,) = torch.autograd.grad(full, x)
    assert 0 < m["segment_clipfrac"] < 1
    x = logp.clone().requires_grad_()
    total = torch.zeros((), dtype=F64)
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):
        part, _ = hispo(
            x[rows],
            old[rows],
            adv[rows],
            mask[rows],
            seg[rows],
            ent[rows],
            global_seqs=seqs,
            global_tokens=123,
            max_len=7,
        )
        total = total + part
    (g_split,) = torch.autograd.grad(total, x)
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_split, g_full, rtol=1e-12, atol=1e-14)


def test_padding_garbage_does_not_leak():
    logp, old, adv, mask, seg, ent = random_case(5)
    nan = float("nan")
    clean, _ = hispo(logp, old, adv, mask, seg, ent)
    x = logp.masked_fill(~mask, nan).requires_grad_()
    loss, m = hispo(
        x,
        old.masked_fill(~mask, nan),
        adv,
        mask,
        seg.masked_fill(~mask, -7),
        ent.masked_fill(~mask, nan),
    )
    loss.backward()
    torch.testing.assert_close(loss, clean, rtol=1e-12, atol=1e-14)
    assert torch.isfinite(x.grad).all() and (x.grad[~mask] == 0).all()
    assert all(math.isfinite(v) for v in m.values())
    empty, _ = hispo(logp, old, adv, torch.zeros_like(mask), seg, ent)
    assert empty.item() == 0.0


def test_errors_name_the_problem():
    logp, old, adv, mask, seg, ent = random_case(6)
    with pytest.raises(ValueError, match="hispo_segments"):
        policy_loss("hispo", logp, old, adv, mask, entropies=ent)
    with pytest.raises(ValueError, match="one advantage per response"):
        hispo(logp, old, adv[:, None].expand_as(logp), mask, seg, ent)
    with pytest.raises(ValueError, match="segment_ids must be >= 0"):
        hispo(logp, old, adv, mask, seg - 5, ent)
    with pytest.raises(ValueError, match="integers"):
        hispo(logp, old, adv, mask, seg.double(), ent)
    with pytest.raises(ValueError, match="entropies"):
        hispo(logp, old, adv, mask, seg, None)
    with pytest.raises(TypeError, match="min_segment"):
        hispo(logp, old, adv, mask, seg, ent, min_seg_len=4)
