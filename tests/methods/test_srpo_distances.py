"""The ranking_distances shaper's block path (top-k lists alone) against its general path."""

from types import SimpleNamespace

import torch

from policyopt.methods.srpo.distances import RankingDistances, placed_candidates


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


def test_placed_candidates_by_lookup():
    # Rollouts without the engine's record: each placed id looked up among its row's
    # left-padded candidates (repeated candidate ids resolve to the first), against a loop.
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        n, w, k = (int(torch.randint(1, m, (1,), generator=g)) for m in (9, 12, 6))
        prompt, pmask = torch.zeros(n, w, dtype=torch.long), torch.zeros(n, w, dtype=torch.long)
        resp, rmask = torch.zeros(n, k, dtype=torch.long), torch.zeros(n, k)
        want = []
        for r in range(n):
            c = int(torch.randint(1, w + 1, (1,), generator=g))
            ids = torch.randint(1, 6, (c,), generator=g)
            prompt[r, w - c :], pmask[r, w - c :] = ids, 1
            length = int(torch.randint(0, k + 1, (1,), generator=g))
            resp[r, :length] = ids[torch.randint(0, c, (length,), generator=g)]
            rmask[r, :length] = 1
            cands = ids.tolist()
            want.append([cands.index(t) for t in resp[r, :length].tolist()] + [-1] * (k - length))
        rollouts = SimpleNamespace(
            prompt_ids=prompt, prompt_mask=pmask, response_ids=resp, response_mask=rmask
        )
        assert placed_candidates(rollouts).tolist() == want
