"""`ranking_distances`: the distances D [N, N] between a group's rankings, for `srpo`.

A reward shaper (it leaves the rewards as they are) that parses each completion's ranking
(a ranking policy's placed items straight from its rollouts; a language model's
`[3] > [1] > [2]` by `rewards.ranking.parse_ranking`), completes it into a ranking of all the query's candidates (the unlisted
ones after the listed, in candidate order; an unparseable completion is the candidate order)
and fills D with `kendall_distances` within each group. D is pairwise structure: entries
between groups stay 0 and are never read.

Options: `weighting` ("top" or "uniform"), `normalize` (divide by the distance between a
ranking and its reverse), `k` (cut the position weights at k, so that only the top-k lists
count; default: each group's longest parsed list, e.g. the k positions a ranking policy
places, so that the order in which unlisted candidates are appended never counts).
"""

from __future__ import annotations

import torch

from policyopt.core.rank_distance import (
    WEIGHTINGS,
    complete_rankings,
    grouped_kendall_distances,
)
from policyopt.core.structure import produces
from policyopt.rewards.ranking import parse_ranking
from policyopt.rewards.shaping import SHAPERS, RewardShaper, ShapingContext
from policyopt.rollout.base import Rollouts


class RankingDistances(RewardShaper):
    def __init__(self, weighting: str = "top", normalize: bool = True, k: int | None = None):
        if weighting not in WEIGHTINGS:
            raise ValueError(
                f"ranking_distances: unknown weighting {weighting!r}; valid: {', '.join(WEIGHTINGS)}"
            )
        if k is not None and k < 1:
            raise ValueError(f"ranking_distances: k must be >= 1, got {k}")
        self.weighting, self.normalize, self.k = weighting, normalize, k

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
            top = torch.full((len(parsed), max(max(map(len, parsed)), 1)), -1, dtype=torch.long)
            for i, p in enumerate(parsed):
                top[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        dist, within = self.distances(top, [len(x) for x in labels], ctx.group_ids)
        ctx.add_structure({"distances": dist}, pairwise=True)
        return rewards, {"srpo/mean_distance": within}

    def distances(
        self, top: torch.Tensor, num_candidates: list[int], group_ids: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """D [N, N] from top lists [N, m] (candidate indices, -1 padding), and the mean
        distance within groups. Groups of one size, candidate count and cutoff are stacked
        into one batched call."""
        n_rows = len(num_candidates)
        lengths = (top >= 0).sum(1).tolist()
        buckets: dict[tuple[int, int, int], list[list[int]]] = {}
        for g in torch.unique(group_ids).tolist():
            rows = (group_ids == g).nonzero().squeeze(1).tolist()
            n = num_candidates[rows[0]]
            if any(num_candidates[r] != n for r in rows):
                raise ValueError(f"ranking_distances: group {g} mixes candidate lists")
            k = self.k or max(max(lengths[r] for r in rows), 1)
            buckets.setdefault((len(rows), n, k), []).append(rows)
        dist = torch.zeros(n_rows, n_rows)
        total, count = 0.0, 0
        for (size, n, k), groups in buckets.items():
            index = torch.tensor(groups)  # [B, G]
            full = complete_rankings(top[index.flatten()][:, : min(top.shape[1], n)], n)
            d = grouped_kendall_distances(
                full.view(*index.shape, n), self.weighting, self.normalize, k=k
            )
            dist[index[:, :, None], index[:, None, :]] = d
            total += float(d.sum())
            count += len(groups) * size * (size - 1)
        return dist, total / count if count else 0.0


def placed_candidates(rollouts: Rollouts) -> torch.Tensor:
    """A ranking policy's rankings as candidate indices, read from its rollouts (the placed
    item ids among the left-padded candidate ids) instead of parsing their text: [N, k],
    -1 past a shorter ranking's end."""
    prompt, pmask = rollouts.prompt_ids, rollouts.prompt_mask.bool()
    match = (rollouts.response_ids[:, :, None] == prompt[:, None, :]) & pmask[:, None, :]
    column = match.long().argmax(-1) - (~pmask).sum(1, keepdim=True)  # minus left padding
    return column.masked_fill(rollouts.response_mask == 0, -1)


@SHAPERS.register("ranking_distances")
@produces("distances")
def ranking_distances(**options: object) -> RankingDistances:
    """SHAPERS factory: RankingDistances(weighting, normalize, k)."""
    return RankingDistances(**options)  # type: ignore[arg-type]
