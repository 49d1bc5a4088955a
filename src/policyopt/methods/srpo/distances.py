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

from policyopt.core.advantages import consecutive_block_size
from policyopt.core.rank_distance import (
    WEIGHTINGS,
    check_top_lists,
    complete_rankings,
    grouped_kendall_distances,
    reverse_distance,
    top_list_pair_distances,
)
from policyopt.core.structure import produces
from policyopt.rewards.ranked_text import parse_ranking
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
        # A ranking engine's own record of its placed items holds distinct candidates by
        # construction; lists looked up or parsed are checked.
        distinct = items is not None and ctx.rollouts.item_columns is not None
        if distinct:
            top = ctx.rollouts.item_columns
        elif items is not None:
            top = placed_candidates(ctx.rollouts)
        else:
            parsed = [parse_ranking(c, len(labels[i])) or [] for i, c in enumerate(ctx.completions)]
            top = _padded_lists(parsed)
        dist, scale, within = self.distances(
            top, [len(x) for x in labels], ctx.group_ids, distinct=distinct
        )
        ctx.add_structure({"distances": dist}, pairwise=True)
        ctx.add_structure({"distance_scale": scale})
        return rewards, {"srpo/mean_distance": within}

    def distances(
        self,
        top: torch.Tensor,
        num_candidates: list[int],
        group_ids: torch.Tensor,
        *,
        distinct: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """D [N, N] from top lists [N, m] (candidate indices, -1 padding), the reverse
        distance of each row's group [N], and the mean distance within groups normalised by
        it (in [0, 1]). Groups of one size, candidate count and cutoff are stacked into one
        batched call. `distinct`: the lists are known to hold distinct indices < n (a ranking
        engine's record), so the block path does not check them again."""
        n_rows = len(num_candidates)
        size = consecutive_block_size(group_ids)
        n = num_candidates[0] if n_rows else 0
        # Every row lists as many items as the widest (lists are padded at the end), and
        # every group ranks the same n candidates: the usual batch, G rollouts per prompt.
        if size is not None and num_candidates.count(n) == n_rows and bool((top[:, -1] >= 0).all()):
            k = self.k or top.shape[1]
            dist = torch.zeros(n_rows, n_rows)  # block-diagonal: group b's block D[b]
            total = self._fill_blocks(dist, top[:, : min(top.shape[1], n)], size, n, k, distinct)
            c = reverse_distance(n, self.weighting, k) if n > 1 else 1.0
            pairs = n_rows * (size - 1)
            return dist, torch.full((n_rows,), c), total / c / pairs if pairs else 0.0
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

    def _fill_blocks(
        self, dist: torch.Tensor, top: torch.Tensor, size: int, n: int, k: int, distinct: bool
    ) -> float:
        """Fill the diagonal blocks of D [N, N] for consecutive groups of `size` rows with
        cutoff k, and return Σ D over them. From the top-k lists alone when every row lists
        at least min(k, n) items and k² is below the n(n−1)/2 item pairs (the usual
        ranking-policy batch: the same numbers, a fraction of the cost); else from the
        completed rankings' pair embeddings."""
        b = dist.shape[0] // size
        blocks = dist.view(b, size, b, size).diagonal(0, 0, 2)  # [G, G, B], a view of D
        if size < 2 or n < 2:
            return 0.0
        cut = min(k, n)
        lists = top[:, :cut]
        if lists.shape[1] == cut and cut * cut <= n * (n - 1) // 2 and bool((lists >= 0).all()):
            if not distinct:
                check_top_lists(top, n)
            d = top_list_pair_distances(lists.reshape(b, size, cut), n, self.weighting)
            i, j = torch.triu_indices(size, size, offset=1)
            blocks[i, j] = d.t()
            blocks[j, i] = d.t()
            return 2.0 * float(d.sum())
        full = complete_rankings(top, n)
        d = grouped_kendall_distances(full.view(b, size, n), self.weighting, False, k=k)
        blocks.copy_(d.permute(1, 2, 0))
        return float(d.sum())


def placed_candidates(rollouts: Rollouts) -> torch.Tensor:
    """A ranking policy's rankings as candidate indices, read from its rollouts (the placed
    item ids among the left-padded candidate ids) instead of parsing their text: [N, k],
    -1 past a shorter ranking's end. Each placed id is looked up among its row's sorted
    candidate ids (`searchsorted`: O(k log P) per row instead of comparing all k × P pairs;
    a repeated candidate id resolves to its first column, as a scan would)."""
    prompt, pmask = rollouts.prompt_ids, rollouts.prompt_mask.bool()
    placed = rollouts.response_mask > 0
    # Padding columns sort after every real id, so a lookup never lands on one by accident.
    keyed = prompt.masked_fill(~pmask, torch.iinfo(prompt.dtype).max)
    ordered, column = keyed.sort(dim=1, stable=True)
    at = torch.searchsorted(ordered, rollouts.response_ids).clamp_(max=prompt.shape[1] - 1)
    stray = placed & (ordered.gather(1, at) != rollouts.response_ids)
    if stray.any():
        row = int(stray.any(1).nonzero()[0, 0])
        raise ValueError(
            f"ranking_distances: rollout {row} places tokens that are not among its candidate "
            "items; on a learning-to-rank task (rows with `items`) the policy must be a ranking "
            "policy (model pl-mlp or pl-linear, rollout.engine=pl). An LM reranker ranks "
            "numbered passages: task rerank"
        )
    pad = prompt.shape[1] - pmask.sum(1, keepdim=True)  # left padding
    return (column.gather(1, at) - pad).masked_fill_(~placed, -1)


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
