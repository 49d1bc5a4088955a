"""Aggregation modes by hand, global normalisers, and micro-batch invariance."""

import pytest
import torch

from policyopt.core import AGG_MODES, aggregate, global_normalisers

torch.set_num_threads(1)

# loss rows [1, 2, 3] and [4, 5, 6]; valid tokens: row 0 -> 1, 2; row 1 -> 4.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 sequences
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 6),  # (3/3 + 4/3) / 2, max_len = width 3
    ],
)
def test_modes_by_hand(mode, expected):
    assert aggregate(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_explicit_normalisers_by_hand():
    assert aggregate(LOSS, MASK, "token-mean", global_tokens=10).item() == pytest.approx(0.7)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum", global_seqs=7).item() == pytest.approx(1.0)
    # Dr. GRPO with max_len = 10: (3/10 + 4/10) / 2 = 0.35
    norm = aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len=10)
    assert norm.item() == pytest.approx(0.35)


def test_dr_grpo_normaliser_is_constant_per_token():
    # Lengths 2 and 4, token losses 1, max_len 8: loss (2/8 + 4/8)/2 = 0.375 and every valid
    # token gets gradient 1/(max_len · N_seq) = 1/16 whatever its sequence's length;
    # seq-mean-token-mean instead gives 1/(T_i · N_seq): 1/4 and 1/8.
    loss = torch.ones(2, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    out = aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=8)
    assert out.item() == pytest.approx(0.375)
    out.backward()
    assert torch.equal(loss.grad, mask / 16)
    loss.grad = None
    aggregate(loss, mask, "seq-mean-token-mean").backward()
    assert torch.allclose(loss.grad[:, 0], torch.tensor([1 / 4, 1 / 8], dtype=torch.float64))


def test_masked_positions_are_ignored_even_if_nan():
    loss = LOSS.clone().requires_grad_()
    with torch.no_grad():
        loss[0, 2] = float("nan")
        loss[1, 1] = float("inf")
    out = aggregate(loss, MASK.bool(), "token-mean")
    out.backward()
    assert out.item() == pytest.approx(7 / 3)
    assert loss.grad[0, 2] == 0 and loss.grad[1, 1] == 0


def test_global_normalisers_skip_empty_rows():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert global_normalisers(mask) == (3, 2)
    # The empty row adds nothing and is not counted: (1.5 + 7) / 2 with LOSS rows 0, 1 -> 0, 2
    loss = torch.tensor([[1.0, 2.0, 3.0], [9.0, 9.0, 9.0], [7.0, 0.0, 0.0]])
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(4.25)


def test_all_masked_gives_zero():
    assert aggregate(LOSS, torch.zeros(2, 3), "seq-mean-token-mean").item() == 0.0


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_sum_equals_full_batch(mode):
    # 8 sequences split 3, 3, 2; each piece is trimmed to its own padded width (as a
    # trainer's micro-batches would be), so only the global normalisers make the sum exact.
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(8, 12, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([12, 3, 0, 7, 1, 5, 9, 2])
    mask = torch.arange(12)[None, :] < lengths[:, None]
    tokens, seqs = global_normalisers(mask)
    norms = {"global_tokens": tokens, "global_seqs": seqs, "max_len": 16}

    full = aggregate(loss, mask, mode, **norms)
    (full_grad,) = torch.autograd.grad(full, loss)

    total = torch.zeros((), dtype=torch.float64)
    for rows in (slice(0, 3), slice(3, 6), slice(6, 8)):
        width = int(lengths[rows].max())
        total = total + aggregate(loss[rows, :width], mask[rows, :width], mode, **norms)
    (split_grad,) = torch.autograd.grad(total, loss)

    assert torch.allclose(total, full, rtol=1e-12, atol=1e-12)
    assert torch.allclose(split_grad, full_grad, rtol=1e-12, atol=1e-12)


def test_local_normalisers_would_differ():
    # Guards the test above: without global normalisers, token-mean depends on the split.
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    full = aggregate(loss, mask, "token-mean")
    split = sum(aggregate(loss[r], mask[r], "token-mean") for r in (slice(0, 2), slice(2, 4)))
    assert not torch.allclose(full, split)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="unknown aggregation mode 'token_mean'; valid modes: "):
        aggregate(LOSS, MASK, "token_mean")
    with pytest.raises(ValueError, match="only 0 and 1"):
        aggregate(LOSS, MASK * 0.5, "token-mean")
    with pytest.raises(ValueError, match=r"mask must be a 2-D tensor of shape \(2, 3\)"):
        aggregate(LOSS, MASK[:, :2], "token-mean")
    with pytest.raises(ValueError, match="loss_mat must be a 2-D"):
        aggregate(LOSS[0], MASK[0], "token-mean")
    with pytest.raises(
        ValueError, match="global_tokens = 2 is smaller than this batch's own count 3"
    ):
        aggregate(LOSS, MASK, "token-mean", global_tokens=2)
    with pytest.raises(ValueError, match="max_len must be positive"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len=0)
