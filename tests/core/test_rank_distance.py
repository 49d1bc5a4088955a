"""Kendall and top-weighted Kendall distances: O(n^2) loops and metric properties."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policyopt.core.rank_distance import (
    check_top_lists,
    complete_rankings,
    grouped_kendall_distances,
    grouped_top_list_distances,
    pair_embedding,
    position_weights,
    top_pair_embedding,
)
from policyopt.methods.srpo import kendall_distances


def kendall_loop(a: list[int], b: list[int]) -> int:
    """Discordant pairs by an O(n^2) loop over item pairs."""
    pa = {item: p for p, item in enumerate(a)}
    pb = {item: p for p, item in enumerate(b)}
    return sum(
        (pa[x] - pa[y]) * (pb[x] - pb[y]) < 0 for x, y in itertools.combinations(range(len(a)), 2)
    )


def top_loop(a: list[int], b: list[int], k: int | None = None) -> float:
    """The top-weighted distance by its per-pair definition: a discordant pair costs the
    mean of w(better position) in the two rankings, a concordant one half their difference."""
    w = lambda p: (1 / math.log2(2 + p)) if k is None or p < k else 0.0  # noqa: E731
    pa = {item: p for p, item in enumerate(a)}
    pb = {item: p for p, item in enumerate(b)}
    total = 0.0
    for x, y in itertools.combinations(range(len(a)), 2):
        wa, wb = w(min(pa[x], pa[y])), w(min(pb[x], pb[y]))
        if (pa[x] - pa[y]) * (pb[x] - pb[y]) < 0:
            total += (wa + wb) / 2
        else:
            total += abs(wa - wb) / 2
    return total


def perms(n: int, count: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g) for _ in range(count)])


def test_uniform_unnormalised_is_kendall_count():
    r = perms(7, 6, 0)
    d = kendall_distances(r, weighting="uniform", normalize=False)
    for i, j in itertools.product(range(6), repeat=2):
        assert float(d[i, j]) == kendall_loop(r[i].tolist(), r[j].tolist())


def test_hand_computed():
    # (0,1,2) vs (1,0,2): one discordant pair; top: pair {0,1} costs w(1) = 1, pairs {0,2}
    # and {1,2} are concordant with better positions 1 -> 2 and 2 -> 1: |1 − 1/log2 3|/2 each.
    r = torch.tensor([[0, 1, 2], [1, 0, 2]])
    assert float(kendall_distances(r, "uniform", False)[0, 1]) == 1.0
    want = 1 + (1 - 1 / math.log2(3))
    assert float(kendall_distances(r, "top", False)[0, 1]) == pytest.approx(want, rel=1e-6)
    # Normalised Kendall: divided by n(n−1)/2 = 3.
    assert float(kendall_distances(r, "uniform", True)[0, 1]) == pytest.approx(1 / 3)


def test_top_matches_per_pair_loop_full_and_cut():
    r = perms(8, 5, 1)
    d = kendall_distances(r, "top", normalize=False)
    dk = kendall_distances(r, "top", normalize=False, k=3)
    for i, j in itertools.product(range(5), repeat=2):
        a, b = r[i].tolist(), r[j].tolist()
        assert float(d[i, j]) == pytest.approx(top_loop(a, b), rel=1e-5)
        assert float(dk[i, j]) == pytest.approx(top_loop(a, b, k=3), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("weighting", ["top", "uniform"])
@pytest.mark.parametrize("k", [None, 1, 3, 10, 50])
@pytest.mark.parametrize("n", [1, 2, 5, 12, 40])
def test_fast_embedding_equals_the_all_pairs_one(n, k, weighting):
    # The fast path (top-k position pairs, one scatter) against the reference embedding over
    # all n(n-1)/2 item pairs: identical entries, hence identical distances.
    r = perms(n, 24, n)
    w = position_weights(n, weighting, k)
    assert torch.equal(top_pair_embedding(r, w, k), pair_embedding(r, w))
    if n > 1:
        phi = pair_embedding(r, w).view(3, 8, -1)
        ref = 0.5 * torch.cdist(phi, phi, p=1)
        ends = pair_embedding(torch.stack([torch.arange(n), torch.arange(n).flip(0)]), w)
        ref = (ref / (0.5 * (ends[0] - ends[1]).abs().sum())).float()
        assert torch.equal(grouped_kendall_distances(r.view(3, 8, n), weighting, k=k), ref)


def test_normalised_reverse_is_one_for_any_ranking():
    r = perms(6, 4, 2)
    both = torch.cat([r, r.flip(1)])
    for weighting in ("top", "uniform"):
        d = kendall_distances(both, weighting)
        for i in range(4):
            assert float(d[i, i + 4]) == pytest.approx(1.0, rel=1e-6)
        assert float(d.max()) <= 1.0 + 1e-6


def test_top_swap_costs_more_than_bottom_swap():
    n = 10
    base = torch.arange(n)
    top, bottom = base.clone(), base.clone()
    top[[0, 1]] = top[[1, 0]]
    bottom[[n - 2, n - 1]] = bottom[[n - 1, n - 2]]
    d = kendall_distances(torch.stack([base, top, bottom]), "top")
    assert float(d[0, 1]) > float(d[0, 2]) > 0
    # Uniform: both swaps are one discordant pair.
    u = kendall_distances(torch.stack([base, top, bottom]), "uniform", normalize=False)
    assert float(u[0, 1]) == float(u[0, 2]) == 1.0


def test_cut_distance_depends_only_on_top_k():
    # Same top-3 lists, different tails: distance 0 at k = 3, and the same distance to a
    # third ranking.
    a = torch.tensor([4, 2, 0, 1, 3, 5])
    b = torch.tensor([4, 2, 0, 5, 3, 1])
    c = torch.tensor([2, 5, 4, 0, 1, 3])
    d = kendall_distances(torch.stack([a, b, c]), "top", k=3)
    assert float(d[0, 1]) == 0.0
    assert float(d[0, 2]) == pytest.approx(float(d[1, 2]), rel=1e-6)


def test_complete_rankings():
    top = torch.tensor([[3, 1, -1], [0, 4, 2]])
    assert complete_rankings(top, 5).tolist() == [[3, 1, 0, 2, 4], [0, 4, 2, 1, 3]]
    with pytest.raises(ValueError, match="repeats"):
        complete_rankings(torch.tensor([[1, 1]]), 3)


def test_errors():
    with pytest.raises(ValueError, match="not a permutation"):
        kendall_distances(torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="unknown weighting"):
        kendall_distances(torch.tensor([[0, 1]]), weighting="bottom")
    assert position_weights(3, "top", k=1).tolist() == [1.0, 0.0, 0.0]


# ---------------------------------------------------------------- metric properties


@st.composite
def three_rankings(draw):
    n = draw(st.integers(min_value=1, max_value=9))
    return [draw(st.permutations(range(n))) for _ in range(3)]


@settings(max_examples=200, deadline=None)
@given(three_rankings(), st.sampled_from(["top", "uniform"]), st.booleans())
def test_metric_axioms(rankings, weighting, normalize):
    r = torch.tensor(rankings, dtype=torch.long)
    d = kendall_distances(r, weighting, normalize).double()
    for i in range(3):
        assert float(d[i, i]) == 0.0
        for j in range(3):
            assert float(d[i, j]) == pytest.approx(float(d[j, i]), abs=1e-6)  # symmetric
            # zero iff equal
            assert (float(d[i, j]) < 1e-9) == (rankings[i] == rankings[j])
            for m in range(3):  # triangle inequality
                assert float(d[i, j]) <= float(d[i, m] + d[m, j]) + 1e-5


@settings(max_examples=100, deadline=None)
@given(three_rankings(), st.integers(min_value=1, max_value=4))
def test_cut_metric_on_top_k_lists(rankings, k):
    """With a cutoff, zero iff the top-k lists are equal; triangle inequality holds."""
    r = torch.tensor(rankings, dtype=torch.long)
    d = kendall_distances(r, "top", normalize=False, k=k).double()
    for i in range(3):
        for j in range(3):
            same_top = rankings[i][:k] == rankings[j][:k]
            assert (float(d[i, j]) < 1e-9) == same_top
            for m in range(3):
                assert float(d[i, j]) <= float(d[i, m] + d[m, j]) + 1e-5


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=2, max_value=12), st.integers(min_value=0, max_value=10))
def test_adjacent_swap_cost_decreases_down_the_list(n, p):
    """Swapping positions p, p+1 costs strictly more the nearer the top."""
    p = min(p, n - 3) if n >= 3 else 0
    base = torch.arange(n)
    rows = [base]
    for q in (p, p + 1):
        if q + 1 < n:
            s = base.clone()
            s[[q, q + 1]] = s[[q + 1, q]]
            rows.append(s)
    d = kendall_distances(torch.stack(rows), "top")
    if len(rows) == 3:
        assert float(d[0, 1]) > float(d[0, 2])


def test_top_list_distances_hand_computed():
    # n = 3, k = 2, lists (0, 1) and (1, 0): w = (1, 1/log2 3), Δw = (1 − 1/log2 3, 1/log2 3).
    # Level 1 (top 1): A = 3 − 1 = 2 pairs touch a top-1 item; the lists share no top-1 item,
    # so K = 0 and H = 2. Level 2: A = 3; concordant pairs touching the top 2 of both: item 0
    # (positions 0, 1) has n − 1 − 0 − 1 + 0 = 1 item below it in both (item 2), item 1 the
    # same: K = 2, H = 1. d = 2(1 − 1/log2 3) + 1/log2 3 = 1 + (1 − 1/log2 3), the swap of
    # the top two in test_hand_computed.
    top = torch.tensor([[[0, 1], [1, 0]]])
    d = grouped_top_list_distances(top, 3, "top")
    want = 1 + (1 - 1 / math.log2(3))
    assert float(d[0, 0, 1]) == pytest.approx(want, rel=1e-6)
    assert float(d[0, 1, 0]) == float(d[0, 0, 1])
    assert float(d[0, 0, 0]) == 0.0 and float(d[0, 1, 1]) == 0.0
    # Uniform: the pairs touching the top 2 ordered differently: only {0, 1}.
    assert float(grouped_top_list_distances(top, 3, "uniform")[0, 0, 1]) == 1.0


@pytest.mark.parametrize("weighting", ["top", "uniform"])
@pytest.mark.parametrize(
    ("n", "k", "size"), [(2, 1, 3), (5, 2, 4), (12, 5, 4), (40, 10, 8), (9, 9, 3)]
)
def test_top_list_distances_equal_the_embedding_ones(n, k, size, weighting):
    # From the lists alone against the completed rankings' embeddings (the reference): equal
    # as float32 (the float64 sums differ in order only), exactly 0 for repeated lists.
    g = torch.Generator().manual_seed(n * k)
    top = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(3 * size)])
    top[1] = top[0]
    top[size + 2] = top[size]
    want = grouped_kendall_distances(
        complete_rankings(top, n).view(3, size, n), weighting, False, k=k
    )
    got = grouped_top_list_distances(top.view(3, size, k), n, weighting)
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    assert float(got[0, 0, 1]) == 0.0 and float(got[1, 0, 2]) == 0.0
    assert torch.equal(got, got.transpose(1, 2))
    assert float(got.max()) > 0


def test_check_top_lists():
    check_top_lists(torch.tensor([[2, 0, -1, -1], [1, 3, 0, 2]]), 4)
    with pytest.raises(ValueError, match="repeats"):
        check_top_lists(torch.tensor([[1, 2, 3], [0, 2, 0]]), 4)
    with pytest.raises(ValueError, match=">= n"):
        check_top_lists(torch.tensor([[4, 0]]), 4)
    with pytest.raises(ValueError, match="of 3 items from n = 2"):
        grouped_top_list_distances(torch.zeros(1, 2, 3, dtype=torch.long), 2)
