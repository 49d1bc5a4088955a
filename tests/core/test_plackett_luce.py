"""Plackett–Luce log-probs, entropies and Gumbel-top-k sampling against brute force."""

import itertools
import math

import pytest
import torch
from scipy import stats

from policyopt.methods.srpo import (
    plackett_luce_entropy,
    plackett_luce_logprobs,
    sample_rankings,
)


def brute_logprob(scores: list[float], ranking: list[int]) -> list[float]:
    """log π(L_t | L_<t) by the definition, one position at a time."""
    remaining = list(range(len(scores)))
    out = []
    for item in ranking:
        z = sum(math.exp(scores[i]) for i in remaining)
        out.append(scores[item] - math.log(z))
        remaining.remove(item)
    return out


def test_hand_computed_two_items():
    # s = (0, log 3): P(item 1 first) = 3/4, then item 0 surely.
    lp = plackett_luce_logprobs(torch.tensor([[0.0, math.log(3)]]), torch.tensor([[1, 0]]))
    assert torch.allclose(lp, torch.tensor([[math.log(0.75), 0.0]]), atol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_matches_brute_force_and_sums_to_one(k):
    torch.manual_seed(0)
    n = 4
    scores = torch.randn(1, n, dtype=torch.float64) * 2
    total = 0.0
    for perm in itertools.permutations(range(n), k):
        lp = plackett_luce_logprobs(scores, torch.tensor([perm]))
        expected = brute_logprob(scores[0].tolist(), list(perm))
        assert torch.allclose(lp[0], torch.tensor(expected, dtype=torch.float64), atol=1e-10)
        total += float(lp.sum().exp())
    # The top-k lists of a PL distribution are a probability distribution.
    assert total == pytest.approx(1.0, abs=1e-10)


def test_stable_for_large_scores_and_batched():
    scores = torch.tensor([[1000.0, 999.0, -1000.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    rankings = torch.tensor([[0, 1], [2, 0]])
    lp = plackett_luce_logprobs(scores, rankings)
    assert torch.isfinite(lp).all()
    want0 = brute_logprob([0.0, -1.0, -2000.0], [0, 1])  # shift-invariant
    assert torch.allclose(lp[0], torch.tensor(want0, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(
        lp[1], torch.tensor([math.log(1 / 3), math.log(1 / 2)], dtype=torch.float64)
    )


def test_entropy_by_definition():
    scores = torch.tensor([[0.3, -1.0, 2.0, 0.5]], dtype=torch.float64)
    ranking = torch.tensor([[2, 0, 3]])
    h = plackett_luce_entropy(scores, ranking)
    remaining = [0, 1, 2, 3]
    for t, item in enumerate(ranking[0].tolist()):
        p = torch.softmax(scores[0, remaining], 0)
        assert float(h[0, t]) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-10)
        remaining.remove(item)


def test_gradient_is_score_function():
    # d log π(L_1) / d s = onehot(L_1) − softmax(s)
    s = torch.tensor([[0.1, 0.7, -0.3]], requires_grad=True)
    plackett_luce_logprobs(s, torch.tensor([[1]])).sum().backward()
    want = torch.tensor([[0.0, 1.0, 0.0]]) - torch.softmax(s.detach(), -1)
    assert torch.allclose(s.grad, want, atol=1e-6)


def test_sampling_frequencies_match_pl_probabilities():
    """Chi-square goodness of fit of 20 000 Gumbel-top-k samples over all 24 orders."""
    n = 4
    scores = torch.tensor([[1.2, 0.0, -0.5, 0.7]])
    gen = torch.Generator().manual_seed(123)
    draws = sample_rankings(scores, 20_000, generator=gen)[0]
    assert draws.shape == (20_000, n)
    perms = list(itertools.permutations(range(n)))
    counts = {p: 0 for p in perms}
    for row in draws.tolist():
        counts[tuple(row)] += 1
    expected = [20_000 * math.exp(sum(brute_logprob(scores[0].tolist(), list(p)))) for p in perms]
    observed = [counts[p] for p in perms]
    assert sum(expected) == pytest.approx(20_000)
    _, p_value = stats.chisquare(observed, expected)
    assert p_value > 1e-3


def test_top_k_sampling_marginals():
    # P(item i first) = softmax(s)_i, with k = 1.
    scores = torch.tensor([[0.0, 1.0, 2.0]])
    gen = torch.Generator().manual_seed(7)
    first = sample_rankings(scores, 30_000, k=1, generator=gen)[0, :, 0]
    freq = torch.bincount(first, minlength=3).float() / 30_000
    assert torch.allclose(freq, torch.softmax(scores[0], 0), atol=0.01)


def test_sampling_shapes_distinct_and_masked_items():
    scores = torch.tensor([[0.0, float("-inf"), 1.0, 0.5]])
    out = sample_rankings(scores, 50, k=3, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 50, 3)
    assert all(len(set(r)) == 3 for r in out[0].tolist())
    assert (out != 1).all()  # the -inf item is never among the finite ones' places


def test_bad_input_errors():
    with pytest.raises(ValueError, match="outside"):
        plackett_luce_logprobs(torch.zeros(1, 3), torch.tensor([[3]]))
    with pytest.raises(ValueError, match="k must be"):
        sample_rankings(torch.zeros(1, 3), 1, k=4)
    with pytest.raises(ValueError, match=r"\[B, n\]"):
        sample_rankings(torch.zeros(3), 1)
