"""NDCG@k, the list metric ranking rewards and evaluations use.

One convention (Burges et al. 2005; LightGBM's and MSLR's): for a ranked list with graded
labels l (0 = not relevant),

    DCG@k  = Σ_{r=1}^{min(k, |list|)} (2^{l_r} − 1) / log2(r + 1)      r the 1-based rank
    NDCG@k = DCG@k / IDCG@k,   IDCG@k the DCG@k of all the query's items sorted by label

and a query with no relevant item (IDCG = 0) scores 0. The ideal list is over all the
query's labelled items, so a list that omits relevant items is penalised.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def dcg_at_k(gains: Tensor, k: int) -> Tensor:
    """Σ_{r<=k} gains[..., r−1] / log2(r + 1) over the last dim."""
    m = min(k, gains.shape[-1])
    ranks = torch.arange(1, m + 1, dtype=gains.dtype, device=gains.device)
    return (gains[..., :m] / torch.log2(ranks + 1.0)).sum(-1)


def ndcg_at_k(labels: Tensor, rankings: Tensor, k: int) -> Tensor:
    """NDCG@k [B] of `rankings` [B, m] (item indices best first; entries < 0 are padding,
    e.g. a list shorter than m) of items with graded labels `labels` [B, n] (entries < 0 mark
    padding items, which count as not relevant)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if labels.dim() != 2 or rankings.dim() != 2 or labels.shape[0] != rankings.shape[0]:
        raise ValueError(
            f"labels must be [B, n] and rankings [B, m] with the same B; got "
            f"{tuple(labels.shape)} and {tuple(rankings.shape)}"
        )
    if (rankings >= labels.shape[1]).any():
        raise ValueError(f"rankings hold item indices >= n = {labels.shape[1]}")
    gains = torch.exp2(labels.double().clamp(min=0)) - 1.0
    listed = gains.gather(1, rankings.clamp(min=0)).masked_fill(rankings < 0, 0.0)
    ideal = dcg_at_k(gains.sort(dim=1, descending=True).values, k)
    dcg = dcg_at_k(listed, k)
    return torch.where(ideal > 0, dcg / ideal.clamp(min=1e-300), 0.0)


def ndcg(labels: list[float], ranking: list[int], k: int) -> float:
    """NDCG@k of one ranked list (indices into `labels`), in plain Python (a reward is one
    list at a time; tested equal to `ndcg_at_k`)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    ideal = sorted(labels, reverse=True)[:k]
    idcg = sum((2.0 ** max(g, 0) - 1) / math.log2(r + 2) for r, g in enumerate(ideal))
    if idcg <= 0:
        return 0.0
    dcg = sum((2.0 ** max(labels[i], 0) - 1) / math.log2(r + 2) for r, i in enumerate(ranking[:k]))
    return dcg / idcg
