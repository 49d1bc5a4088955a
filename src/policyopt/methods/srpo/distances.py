"""`ranking_distances`: the distances D [N, N] between a group's rankings, for `srpo`.

A reward shaper (it leaves the rewards as they are) that parses each completion's ranking
(a ranking policy's placed items straight from its rollouts; a language model's
`[3] > [1] > [2]` by `rewards.ranking.parse_ranking`), completes it into a ranking of all the query's candidates (the unlisted
ones after the listed, in candidate order; an unparseable completion is the candidate order)
and fills D with `kendall_distances` within each group (not normalised). D is pairwise
structure: entries between groups stay 0 and are never read. It also produces
`distance_scale` [N], d(σ, reverse σ) for each rollout's group (the largest distance between
rankings of its n items with its cutoff k), which the `srpo` advantage divides by with
`normalize="reverse"` (the scale is the advantage's option, `algorithm.advantage_options`).

Options: `weighting` ("top" or "uniform"), `k` (cut the position weights at k, so that only
the top-k lists count; default: each group's longest parsed list, e.g. the k positions a
ranking policy places, so that the order in which unlisted candidates are appended never
counts).

Rows with an `items` column (`ltr_synthetic`, `letor`, `mslr`) are a ranking policy's:
its rankings are read from the rollouts, and a rollout that places a token that is not one
of its candidates (a language model's text) is an error that says so.
"""

from __future__ import annotations

import torch

from policyopt.core.rank_distance import (
    WEIGHTINGS,
    check_top_lists,
    complete_rankings,
    grouped_kendall_distances,
    grouped_top_list_distances,
    reverse_distance,
)
from policyopt.core.structure import produces
from policyopt.rewards.ranking import parse_ranking
from policyopt.rewards.shaping import SHAPERS, RewardShaper, ShapingContext
from policyopt.rollout.base import Rollouts


class RankingDistances(RewardShaper):
    def __init__(self, weighting: str = "top", k: int | None = None, **unknown: object):
        if "normalize" in unknown:
            raise ValueError(
                "ranking_distances: `normalize` moved to the srpo advantage: set "
                "algorithm.advantage_options.normalize (reverse, group_mean or none)"
            )
        if unknown:
            raise ValueError(
                f"ranking_distances: unknown option(s) {', '.join(sorted(unknown))}; "
                "valid: weighting, k"
            )
        if weighting not in WEIGHTINGS:
            raise ValueError(
                f"ranking_distances: unknown weighting {weighting!r}; valid: {', '.join(WEIGHTINGS)}"
            )
        if k is not None and k < 1:
            raise ValueError(f"ranking_distances: k must be >= 1, got {k}")
        self.weighting, self.k = weighting, k

    def __call__(
        self, rewards: torch.Tensor, ctx: ShapingContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if "labels" not in ctx.columns:
            raise ValueError(
                "ranking_distances needs a ranking task (rows with a 'labels' column: "
                "ltr_synthetic, letor, mslr, rerank)"
            )
        labels, items = ctx.columns["labels"], ctx.columns.get("items")
        if items is not None:
            top = placed_candidates(ctx.rollouts)
        else:
            parsed = [parse_ranking(c, len(labels[i])) or [] for i, c in enumerate(ctx.completions)]
            top = _padded_lists(parsed)
        dist, scale, within = self.distances(top, [len(x) for x in labels], ctx.group_ids)
        ctx.add_structure({"distances": dist}, pairwise=True)
        ctx.add_structure({"distance_scale": scale})
        return rewards, {"srpo/mean_distance": within}

    def distances(
        self, top: torch.Tensor, num_candidates: list[int], group_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """D [N, N] from top lists [N, m] (candidate indices, -1 padding), the reverse
        distance of each row's group [N], and the mean distance within groups normalised by
        it (in [0, 1]). Groups of one size, candidate count and cutoff are stacked into one
        batched call."""
        n_rows = len(num_candidates)
        lengths = (top >= 0).sum(1)
        fast = _equal_blocks(group_ids, num_candidates, lengths)
        if fast is not None:  # the usual batch: G rollouts per prompt, one after another
            size, n = fast
            k = self.k or max(int(lengths[0]), 1)
            d = self._block_distances(top[:, : min(top.shape[1], n)], size, n, k)
            dist = torch.zeros(n_rows, n_rows)  # block-diagonal: group b's block is d[b]
            dist.view(len(d), size, len(d), size).diagonal(0, 0, 2).copy_(d.permute(1, 2, 0))
            c = reverse_distance(n, self.weighting, k) if n > 1 else 1.0
            pairs = n_rows * (size - 1)
            return dist, torch.full((n_rows,), c), float(d.sum()) / c / pairs if pairs else 0.0
        lengths = lengths.tolist()
        buckets: dict[tuple[int, int, int], list[list[int]]] = {}
        for g in torch.unique(group_ids).tolist():
            rows = (group_ids == g).nonzero().squeeze(1).tolist()
            n = num_candidates[rows[0]]
            if any(num_candidates[r] != n for r in rows):
                raise ValueError(f"ranking_distances: group {g} mixes candidate lists")
            k = self.k or max(max(lengths[r] for r in rows), 1)
            buckets.setdefault((len(rows), n, k), []).append(rows)
        dist = torch.zeros(n_rows, n_rows)
        scale = torch.ones(n_rows)
        total, count = 0.0, 0
        for (size, n, k), groups in buckets.items():
            index = torch.tensor(groups)  # [B, G]
            full = complete_rankings(top[index.flatten()][:, : min(top.shape[1], n)], n)
            d = grouped_kendall_distances(full.view(*index.shape, n), self.weighting, False, k=k)
            dist[index[:, :, None], index[:, None, :]] = d
            c = reverse_distance(n, self.weighting, k) if n > 1 else 1.0
            scale[index.flatten()] = c
            total += float(d.sum()) / c
            count += len(groups) * size * (size - 1)
        return dist, scale, total / count if count else 0.0

    def _block_distances(self, top: torch.Tensor, size: int, n: int, k: int) -> torch.Tensor:
        """D [B, G, G] of consecutive groups of `size` rows with cutoff k. From the top-k
        lists alone when every row lists at least min(k, n) items and k² is below the
        n(n−1)/2 item pairs (the usual ranking-policy batch: the same numbers, a fraction of
        the cost); else from the completed rankings' pair embeddings."""
        cut = min(k, n)
        lists = top[:, :cut]
        if lists.shape[1] == cut and cut * cut <= n * (n - 1) // 2 and bool((lists >= 0).all()):
            check_top_lists(top, n)
            return grouped_top_list_distances(lists.reshape(-1, size, cut), n, self.weighting)
        full = complete_rankings(top, n)
        return grouped_kendall_distances(full.view(-1, size, n), self.weighting, False, k=k)


def placed_candidates(rollouts: Rollouts) -> torch.Tensor:
    """A ranking policy's rankings as candidate indices, read from its rollouts (the placed
    item ids among the left-padded candidate ids) instead of parsing their text: [N, k],
    -1 past a shorter ranking's end."""
    prompt, pmask = rollouts.prompt_ids, rollouts.prompt_mask.bool()
    match = (rollouts.response_ids[:, :, None] == prompt[:, None, :]) & pmask[:, None, :]
    found, first = match.max(-1)  # any match, and the first one's column (one pass)
    stray = (rollouts.response_mask > 0) & ~found
    if stray.any():
        row = int(stray.any(1).nonzero()[0, 0])
        raise ValueError(
            f"ranking_distances: rollout {row} places tokens that are not among its candidate "
            "items; on a learning-to-rank task (rows with `items`) the policy must be a ranking "
            "policy (model pl-mlp or pl-linear, rollout.engine=pl). An LM reranker ranks "
            "numbered passages: task rerank"
        )
    column = first - (~pmask).sum(1, keepdim=True)  # minus left padding
    return column.masked_fill(rollouts.response_mask == 0, -1)


def _equal_blocks(
    group_ids: torch.Tensor, num_candidates: list[int], lengths: torch.Tensor
) -> tuple[int, int] | None:
    """(group size, candidates) when the groups are consecutive blocks of one size, every
    row has the same number of candidates and of listed items; else None."""
    if not len(num_candidates) or len(set(num_candidates)) != 1:
        return None
    ids, counts = torch.unique_consecutive(group_ids, return_counts=True)
    if len(torch.unique(ids)) != len(ids) or (counts != counts[0]).any():
        return None
    if (lengths != lengths[0]).any():
        return None
    return int(counts[0]), num_candidates[0]


def _padded_lists(parsed: list[list[int]]) -> torch.Tensor:
    top = torch.full((len(parsed), max(max(map(len, parsed)), 1)), -1, dtype=torch.long)
    for i, p in enumerate(parsed):
        top[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return top


@SHAPERS.register("ranking_distances")
@produces("distances", "distance_scale")
def ranking_distances(**options: object) -> RankingDistances:
    """SHAPERS factory: RankingDistances(weighting, k)."""
    return RankingDistances(**options)  # type: ignore[arg-type]
