"""Distances between rankings of the same n items: Kendall's, and a top-weighted Kendall.

The top weighting (SRPO's is unpublished; SPEC §6 asks for one that is a metric and makes
disagreements near the top cost more) is the L1 distance between pair embeddings. For a
ranking σ with pos_σ(a) the 1-based position of item a, and every item pair a < b,

    Φ_ab(σ) = sgn_σ(a, b) · w(min(pos_σ(a), pos_σ(b)))
    d(σ, τ) = ½ Σ_{a<b} |Φ_ab(σ) − Φ_ab(τ)|

sgn_σ(a, b) = +1 when σ puts a above b, −1 otherwise; w(p) is the weight of the pair's better
position: w(p) = 1/log2(1 + p) (NDCG's discount) for `weighting="top"`, w ≡ 1 for
`"uniform"`. So a discordant pair costs (w_σ + w_τ)/2, the mean of its top position's weight
in the two rankings, and a concordant pair whose better position moved costs |w_σ − w_τ|/2.
With w ≡ 1 only discordant pairs count, 1 each: the plain Kendall distance.

Why it is a metric (on permutations; property-tested): d is half the L1 norm of Φ(σ) − Φ(τ),
so it is non-negative, symmetric and obeys the triangle inequality (those of the L1 norm).
And d(σ, τ) = 0 only if σ = τ: w > 0, so Φ(σ) = Φ(τ) means every pair has the same order in
both, which fixes the ranking.

Top-heavy: swapping ranks 1 and 2 of n items costs 2·w(1)/2 + (n − 2)·(w(1) − w(2)) =
1 + 0.37(n − 2); swapping the last two costs w(n − 1) only.

Top-k lists (`k`): with w(p) = 0 for p > k, a pair ranked below k in both rankings costs
nothing and a pair with an item in a top k has its sign fixed by the top-k list, so d
depends only on the two top-k lists (any completion of the tails gives the same value); it
is a metric on top-k lists (a pseudo-metric on full rankings). `normalize` divides by the
distance between a ranking and its reverse (the same for every ranking, since d depends on
positions only), so d is in [0, 1] for full rankings.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

WEIGHTINGS = ("top", "uniform")


def position_weights(n: int, weighting: str, k: int | None = None) -> Tensor:
    """w(p) for positions p = 1..n (float64), zero past the cutoff k."""
    p = torch.arange(1, n + 1, dtype=torch.float64)
    if weighting == "top":
        w = 1.0 / torch.log2(1.0 + p)
    elif weighting == "uniform":
        w = torch.ones(n, dtype=torch.float64)
    else:
        raise ValueError(f"unknown weighting {weighting!r}; valid: {', '.join(WEIGHTINGS)}")
    if k is not None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        w[k:] = 0.0
    return w


def check_permutations(rankings: Tensor) -> None:
    """Each row must be a permutation of 0..n-1."""
    if rankings.dim() != 2:
        raise ValueError(f"rankings must be [G, n], got shape {tuple(rankings.shape)}")
    if rankings.is_floating_point():
        raise ValueError(f"rankings must hold item indices (integers), got {rankings.dtype}")
    n = rankings.shape[1]
    expected = torch.arange(n, device=rankings.device)
    bad = (rankings.sort(dim=1).values != expected).any(dim=1)
    if bad.any():
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"rankings[{row}] = {rankings[row].tolist()} is not a permutation of 0..{n - 1}"
        )


@functools.lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[Tensor, Tensor]:
    a, b = torch.triu_indices(n, n, offset=1)
    return a, b


def pair_embedding(rankings: Tensor, weights: Tensor) -> Tensor:
    """Φ(σ) [G, n(n−1)/2] of each ranking (module docstring), pairs a < b in triu order."""
    g, n = rankings.shape
    pos = torch.empty_like(rankings)
    pos.scatter_(1, rankings, torch.arange(n, device=rankings.device).expand(g, n))
    a, b = (x.to(rankings.device) for x in _pairs(n))
    pa, pb = pos[:, a], pos[:, b]
    # w(better position), negated where b is above a.
    signed = torch.cat([weights, -weights]).to(rankings.device)
    return signed[torch.minimum(pa, pb) + n * (pa > pb)]


def kendall_distances(
    rankings: Tensor,
    weighting: str = "top",
    normalize: bool = True,
    *,
    k: int | None = None,
) -> Tensor:
    """Pairwise distances [G, G] (float32) between rankings [G, n] of the same n items.

    Row i lists item indices best first (a permutation of 0..n-1). `weighting="uniform"`,
    `normalize=False` is the number of discordant pairs; `"top"` the top-weighted metric of
    the module docstring; `k` cuts the weights at position k (distances between top-k lists).
    """
    check_permutations(rankings)
    return grouped_kendall_distances(rankings[None], weighting, normalize, k=k)[0]


def grouped_kendall_distances(
    rankings: Tensor,
    weighting: str = "top",
    normalize: bool = True,
    *,
    k: int | None = None,
) -> Tensor:
    """`kendall_distances` of B groups at once: rankings [B, G, n] -> [B, G, G] (rows are
    assumed to be permutations; `kendall_distances` checks them)."""
    b, g, n = rankings.shape
    if n < 2:
        return torch.zeros(b, g, g)
    weights = position_weights(n, weighting, k)
    phi = top_pair_embedding(rankings.reshape(b * g, n), weights, k).view(b, g, -1)
    dist = 0.5 * torch.cdist(phi, phi, p=1)
    if normalize:
        dist = dist / reverse_distance(n, weighting, k)
    return dist.float()


@functools.lru_cache(maxsize=64)
def reverse_distance(n: int, weighting: str, k: int | None = None) -> float:
    """d(σ, reverse σ), the normaliser (the same for every σ of n items)."""
    ends = torch.stack([torch.arange(n), torch.arange(n - 1, -1, -1)])
    e = pair_embedding(ends, position_weights(n, weighting, k))
    return float(0.5 * (e[0] - e[1]).abs().sum())


@functools.lru_cache(maxsize=64)
def _position_pairs(n: int, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Position pairs p < q with p < k (the only ones whose weight w(p) can be nonzero), and
    the triu index of each item pair (a, b), a < b, as a flat [n * n] table."""
    p, q = torch.triu_indices(n, n, offset=1)
    keep = p < k
    table = torch.zeros(n, n, dtype=torch.long)
    a, b = _pairs(n)
    table[a, b] = torch.arange(a.numel())
    return p[keep], q[keep], table.view(-1)


def top_pair_embedding(rankings: Tensor, weights: Tensor, k: int | None = None) -> Tensor:
    """`pair_embedding`, equal to it entry for entry, computed from the top k positions only.

    Φ_ab is nonzero only for pairs whose better position p is < k (w(p) = 0 beyond the
    cutoff), so instead of all n(n−1)/2 item pairs it visits the position pairs (p, q),
    p < q, p < k: the items σ_p above σ_q, entry Φ_{min, max} = ±w(p), + when σ_p < σ_q."""
    r, n = rankings.shape
    p, q, table = (x.to(rankings.device) for x in _position_pairs(n, min(k or n, n)))
    upper, lower = rankings[:, p], rankings[:, q]
    slot = table[torch.minimum(upper, lower) * n + torch.maximum(upper, lower)]
    w = weights.to(rankings.device)[p]
    signed = torch.where(upper < lower, w, -w)
    phi = torch.zeros(r, n * (n - 1) // 2, dtype=weights.dtype, device=rankings.device)
    return phi.scatter_(1, slot, signed)


def check_top_lists(top: Tensor, n: int) -> None:
    """Top lists [G, m] (entries < 0 are padding) must hold distinct item indices < n
    (the errors of `complete_rankings`)."""
    if (top >= n).any():
        raise ValueError(f"top lists hold item indices >= n = {n}")
    ordered = top.sort(dim=1).values
    repeat = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    if repeat.any():
        row = int(repeat.any(1).nonzero()[0, 0])
        raise ValueError(f"top list {row} repeats an item: {top[row].tolist()}")


def grouped_top_list_distances(top: Tensor, n: int, weighting: str = "top") -> Tensor:
    """`grouped_kendall_distances(..., normalize=False, k=k)` of B groups of top-k lists
    [B, G, k] (distinct item indices < n, no padding, k <= n), from the lists alone: the
    same distances (equal up to float64 rounding), without completing the rankings or
    building the n(n−1)/2 pair embedding; O(G²k²) per group instead of O(G²n²) (SRPO's step
    cost, issue 21).

    Why it is the same number. w is non-increasing and 0 past k, so with Δw_l = w(l) − w(l+1)
    (w(k+1) = 0) a pair whose better position is p weighs Σ_{l >= p} Δw_l, and
        d(σ, τ) = Σ_l Δw_l · (A_l − K_l),    l = 1..k, integers A_l, K_l:
    A_l the number of item pairs with an item in the top l (n(n−1)/2 − (n−l)(n−l−1)/2, the
    same for every ranking), K_l the number of pairs with an item in the top l of both
    rankings that σ and τ order alike. (Per pair, ½|Φ_ab(σ) − Φ_ab(τ)| is ½(u_σ + u_τ) −
    min(u_σ, u_τ) when concordant and ½(u_σ + u_τ) when not, u the pair's weight; expand u
    and min(u_σ, u_τ) over the levels l.) A concordant pair has the same upper item x in
    both rankings, at position p in σ and r in τ (0-based); the items below x in both
    number c_x = n − 1 − p − r + |σ_<p ∩ τ_<r| (σ_<p the items above position p), and
    |σ_<p ∩ τ_<r| = #{p' < p : r(σ_p') < r}. So K_l = Σ_{x in both lists, max(p, r) < l} c_x.
    Integer counts make equal lists exactly 0 apart and d exactly symmetric, as the L1 norm
    of the embeddings does."""
    b, g, k = top.shape
    out = torch.zeros(b, g, g, device=top.device)
    if k > n:
        raise ValueError(f"top lists of {k} items from n = {n}")
    if n < 2 or k == 0 or b * g == 0:
        return out
    i, j = (x.to(top.device) for x in _pairs(g))
    d = top_list_pair_distances(top, n, weighting)
    out[:, i, j] = d
    out[:, j, i] = d
    return out


def top_list_pair_distances(top: Tensor, n: int, weighting: str = "top") -> Tensor:
    """The distances of `grouped_top_list_distances` as [B, G(G−1)/2], one per unordered
    pair of a group's lists (i < j, in `torch.triu_indices` order): what the block-diagonal
    [N, N] of the `ranking_distances` shaper is filled from directly. Needs n >= 2, k >= 1."""
    b, g, k = top.shape
    if k > n:
        raise ValueError(f"top lists of {k} items from n = {n}")
    dev = top.device
    dw, pos, earlier, reach = (x.to(dev) for x in _level_constants(n, weighting, k))
    i, j = (x.to(dev) for x in _pairs(g))  # each unordered pair once: d is symmetric
    # where[b, j, item]: the item's position in list j, k when j does not list it.
    where = torch.full((b, g, n), k, dtype=torch.long, device=dev)
    where.scatter_(2, top, pos.expand(b, g, k))
    # r [B, pairs, p]: list j's position of list i's item p (one gather on the flat table).
    flat = (j[:, None] * n + top[:, i]).view(b, -1)
    r = where.view(b, g * n).gather(1, flat).view(b, i.numel(), k)
    # |σ_<p ∩ τ_<r| = #{p' < p : r_p' < r_p}; the int32 sum is the cheaper reduction.
    both_above = ((r[..., None, :] < r[..., :, None]) & earlier).sum(-1, dtype=torch.int32)
    below = (n - 1) - pos - r + both_above  # c_x; meaningless where r = k (not counted)
    level = torch.maximum(pos, r)  # first l (0-based) whose K_l counts x; k: never
    counts = torch.zeros(b, i.numel(), k + 1, dtype=torch.long, device=dev)
    concordant = counts.scatter_add_(2, level, below)[..., :k].cumsum(2)  # K_l
    return ((reach - concordant).double() @ dw).float()


@functools.lru_cache(maxsize=64)
def _level_constants(n: int, weighting: str, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For `top_list_pair_distances` (not to be modified): Δw_l, the positions 0..k−1, the
    [p, p'] mask p' < p, and A_l = n(n−1)/2 − (n−l)(n−l−1)/2 for l = 1..k (the pairs with an
    item in the top l, the same for every ranking)."""
    pos = torch.arange(k)
    earlier = torch.ones(k, k, dtype=torch.bool).tril(-1)
    left = n - 1 - pos  # items outside the top l + 1
    reach = (n * (n - 1) - left * (left - 1)) // 2
    return _level_weights(n, weighting, k), pos, earlier, reach


@functools.lru_cache(maxsize=64)
def _level_weights(n: int, weighting: str, k: int) -> Tensor:
    """Δw_l = w(l) − w(l + 1) for l = 1..k, w(k + 1) = 0 (float64; not to be modified)."""
    w = position_weights(n, weighting, k)[:k]
    return torch.cat([w[:-1] - w[1:], w[-1:]])


def complete_rankings(top: Tensor, n: int) -> Tensor:
    """Full rankings [G, n] from top lists [G, m] (item indices; entries < 0 are padding,
    e.g. a shorter parsed list): each row's listed items first, in order, then the items it
    does not list in increasing index. Repeated or out-of-range items are an error."""
    if top.dim() != 2:
        raise ValueError(f"top lists must be [G, m], got shape {tuple(top.shape)}")
    g, m = top.shape
    if (top >= n).any():
        raise ValueError(f"top lists hold item indices >= n = {n}")
    # Sort key per item: its listed position, or m + its index when unlisted.
    key = (m + torch.arange(n, device=top.device)).expand(g, n).clone()
    valid = top >= 0
    rows, cols = valid.nonzero(as_tuple=True)
    items = top[rows, cols]
    seen = torch.zeros(g, n, dtype=torch.long, device=top.device)
    seen.index_put_((rows, items), torch.ones_like(items), accumulate=True)
    if (seen > 1).any():
        row = int((seen > 1).any(1).nonzero()[0, 0])
        raise ValueError(f"top list {row} repeats an item: {top[row].tolist()}")
    key[rows, items] = cols
    return key.argsort(dim=1)
