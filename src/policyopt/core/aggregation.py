"""Loss aggregation: a per-token loss matrix [N, T] -> one scalar, with global normalisers.

Modes (verl's names). With m_{i,t} the mask, ℓ_{i,t} the token loss, T_i = Σ_t m_{i,t},
N_tok the number of valid tokens and N_seq the number of sequences (with at least one
valid token) of the GLOBAL batch:

- `token-mean` (DAPO, arXiv 2503.14476):         Σ_{i,t} m ℓ / N_tok
- `seq-mean-token-mean` (GRPO, DeepSeekMath):    Σ_i [Σ_t m ℓ / T_i] / N_seq
- `seq-mean-token-sum`:                          Σ_i [Σ_t m ℓ] / N_seq
- `seq-mean-token-sum-norm` (Dr. GRPO, arXiv 2503.20783):
                                                 Σ_i [Σ_t m ℓ / max_len] / N_seq

The micro-batch contract, which is how the trainer uses this function: split a global batch
(all micro-batches of one optimizer step, on all data-parallel ranks) by rows, call
`aggregate` on each piece with the SAME `global_tokens`, `global_seqs` (from
`global_normalisers` summed over the pieces) and `max_len`, and SUM the results (backward on
each, one optimizer step). The sum equals the full batch's loss, and the summed gradients
equal its gradient, whatever the micro-batch size or the number of ranks: every normaliser
is either per sequence (T_i) or a constant of the global batch. `max_len` must then be a
constant too (the maximum generation length), not each piece's padded width.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

Count = int | float | Tensor


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Aggregate `loss_mat` [N, T] over the valid tokens of `mask` [N, T] into a scalar.

    global_tokens: valid tokens in the whole global batch (default: this batch's count).
    global_seqs: sequences with at least one valid token in the whole global batch
        (default: this batch's count).
    max_len: Dr. GRPO's constant length normaliser (default: the mask width T).
    Masked positions of `loss_mat` are ignored even if they hold inf or NaN. A normaliser of
    0 (nothing valid anywhere) gives a loss of 0.
    """
    if not isinstance(loss_mat, Tensor) or loss_mat.dim() != 2:
        got = tuple(loss_mat.shape) if isinstance(loss_mat, Tensor) else type(loss_mat).__name__
        raise ValueError(f"loss_mat must be a 2-D tensor [N, T], got {got}")
    valid = as_bool_mask(mask, loss_mat.shape, "mask")
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    tokens, seqs = global_normalisers(valid)
    n_tok = _count("global_tokens", global_tokens, tokens)
    n_seq = _count("global_seqs", global_seqs, seqs)
    masked = torch.where(valid, loss_mat, 0.0)

    if mode == "token-mean":
        return masked.sum() / n_tok
    seq_sum = masked.sum(dim=-1)  # Σ_t m ℓ, [N]
    if mode == "seq-mean-token-mean":
        seq_len = valid.sum(dim=-1).clamp(min=1)  # T_i (rows with T_i = 0 have sum 0)
        return (seq_sum / seq_len).sum() / n_seq
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / n_seq
    # seq-mean-token-sum-norm
    if max_len is None:
        max_len = loss_mat.shape[-1]
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    return (seq_sum / max_len).sum() / n_seq


def global_normalisers(mask: Tensor) -> tuple[int, int]:
    """(valid tokens, sequences with at least one valid token) of `mask` [N, T].

    Sum these over the micro-batches and ranks of one optimizer step to get the
    `global_tokens` and `global_seqs` that `aggregate` needs.
    """
    valid = as_bool_mask(mask, mask.shape, "mask")
    return int(valid.sum()), int(valid.any(dim=-1).sum())


def as_bool_mask(mask: Tensor, shape: torch.Size | tuple[int, ...], name: str) -> Tensor:
    """`mask` as a bool tensor of `shape`; a numeric mask must hold only 0 and 1."""
    if not isinstance(mask, Tensor) or mask.shape != tuple(shape) or mask.dim() != 2:
        got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a 2-D tensor of shape {tuple(shape)}, got {got}")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1 (or be a bool tensor)")
    return mask != 0


def _count(name: str, given: Count | None, local: int) -> Tensor | float:
    """The normaliser to divide by: `given` or the local count, at least 1 (0/0 -> 0)."""
    if given is None:
        return float(max(local, 1))
    if isinstance(given, Tensor):
        return given.clamp(min=1)
    if given < local:
        # A global count below the local one is a bookkeeping bug upstream, never intended.
        raise ValueError(f"{name} = {given} is smaller than this batch's own count {local}")
    return float(max(given, 1))
