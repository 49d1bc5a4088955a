"""The Plackett–Luce (PL) distribution over rankings of n items with scores s [n].

A ranking L = (L_1, ..., L_k) of k <= n distinct items (a top-k list when k < n) has

    log π(L) = Σ_t log π(L_t | L_<t),   log π(L_t | L_<t) = s[L_t] − logsumexp_{i ∉ L_<t} s_i

(the item at position t is drawn with probability softmax over the items not yet placed).
Exact sampling by the Gumbel-top-k trick (Yellott 1977; Kool et al. 2019): perturb each score
with independent Gumbel(0, 1) noise and sort descending; the first k items are a PL sample.
A ranking policy's "tokens" are the items it places at each position (one per position).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(scores: Tensor, rankings: Tensor) -> None:
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, n], got shape {tuple(scores.shape)}")
    if rankings.dim() != 2 or rankings.shape[0] != scores.shape[0]:
        raise ValueError(
            f"rankings must be [B, k] with B = {scores.shape[0]}, got shape {tuple(rankings.shape)}"
        )
    if rankings.shape[1] > scores.shape[1]:
        raise ValueError(f"rankings place {rankings.shape[1]} items of only {scores.shape[1]}")
    if rankings.is_floating_point():
        raise ValueError(f"rankings must hold item indices (integers), got {rankings.dtype}")
    if rankings.numel() and (rankings.min() < 0 or rankings.max() >= scores.shape[1]):
        raise ValueError(f"rankings hold indices outside [0, {scores.shape[1] - 1}]")


def plackett_luce_logprobs(scores: Tensor, rankings: Tensor) -> Tensor:
    """log π(L_t | L_<t) [B, k] of each position of `rankings` [B, k] under scores [B, n].

    Items must be distinct within a row. The normaliser over the remaining items is the
    log-sum-exp of the placed-later items L_t..L_k (a reverse cumulative logsumexp) and of
    the never-placed ones, so no exp is subtracted (stable for any score scale): O(B n).
    """
    _check(scores, rankings)
    placed = scores.gather(1, rankings)  # s[L_t], [B, k]
    # logsumexp over L_t..L_k for each t: reverse, cumulative logsumexp, reverse back.
    later = torch.logcumsumexp(placed.flip(1), dim=1).flip(1)
    unplaced = torch.ones_like(scores, dtype=torch.bool).scatter(1, rankings, False)
    rest = torch.logsumexp(scores.masked_fill(~unplaced, float("-inf")), dim=1, keepdim=True)
    if rankings.shape[1] == scores.shape[1]:
        return placed - later  # a full ranking: nothing is left unplaced
    return placed - torch.logaddexp(later, rest)


def plackett_luce_entropy(scores: Tensor, rankings: Tensor) -> Tensor:
    """Entropy [B, k] of the distribution of position t given L_<t (softmax of the scores of
    the items not yet placed): H_t = logsumexp(z) − Σ_i softmax(z)_i z_i over those items."""
    _check(scores, rankings)
    b, n = scores.shape
    k = rankings.shape[1]
    onehot = torch.zeros(b, k, n, dtype=torch.bool, device=scores.device)
    onehot.scatter_(2, rankings[:, :, None], True)
    # Items placed strictly before position t: exclusive cumulative sum over positions.
    before = (onehot.cumsum(1) - onehot.long()).bool()
    z = scores[:, None, :].expand(b, k, n).masked_fill(before, float("-inf"))
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp.masked_fill(before, 0.0)).sum(-1)


def sample_rankings(
    scores: Tensor,
    num_samples: int,
    k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """`num_samples` PL rankings (top-k lists) per row of scores [B, n] -> [B, num_samples, k].

    Gumbel-top-k: argsort of s + G, G_i = −log(−log U_i), U_i ~ Uniform(0, 1), descending.
    Items with score −inf are never placed while finite ones remain.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, n], got shape {tuple(scores.shape)}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    n = scores.shape[1]
    k = n if k is None else k
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    shape = (scores.shape[0], num_samples, n)
    u = torch.rand(shape, generator=generator, device=scores.device, dtype=torch.float64)
    # U in (0, 1): clamp away the 0 that rand may return, where −log(−log 0) is −inf.
    gumbel = -torch.log(-torch.log(u.clamp(min=torch.finfo(torch.float64).tiny)))
    perturbed = scores.detach().double()[:, None, :] + gumbel
    return perturbed.topk(k, dim=-1).indices
