"""The ranking_distances shaper's block path (top-k lists alone) against its general path."""

import torch

from policyopt.methods.srpo.distances import RankingDistances


def test_block_path_equals_the_general_path():
    # The same 4 groups of 8 top-10 lists of 40 candidates, once as consecutive blocks (the
    # lists-only path) and once with the rows interleaved (the per-group loop over completed
    # rankings): the same D, scale and mean distance, and 0 between repeated lists.
    g = torch.Generator().manual_seed(3)
    top = torch.stack([torch.randperm(40, generator=g)[:10] for _ in range(32)])
    top[1] = top[0]
    blocks = torch.arange(32) // 8
    shaper = RankingDistances()
    dist, scale, mean = shaper.distances(top, [40] * 32, blocks)
    order = torch.arange(32).view(4, 8).t().flatten()  # row r of the new batch is old order[r]
    d2, s2, m2 = shaper.distances(top[order], [40] * 32, blocks[order])
    assert torch.equal(dist[order][:, order], d2)
    assert torch.equal(scale, s2) and abs(mean - m2) < 1e-6
    assert float(dist[0, 1]) == 0.0 and float(dist[0, 2]) > 0 and float(dist[0, 8]) == 0.0
    assert torch.equal(dist, dist.t())
