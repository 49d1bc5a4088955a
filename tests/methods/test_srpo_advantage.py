"""The srpo advantage against a plain Python loop over the formula."""

import math
import statistics

import pytest
import torch

from policyopt.core import compute_advantages
from policyopt.methods import srpo  # noqa: F401  (registers the "srpo" advantage)


def loop_srpo(rewards, group_ids, distances, eps=1e-6):
    out = []
    for i, (r_i, g_i) in enumerate(zip(rewards, group_ids, strict=True)):
        group = [j for j, g in enumerate(group_ids) if g == g_i]
        members = [rewards[j] for j in group]
        if len(group) < 2 or len(set(members)) == 1:
            out.append(0.0)
            continue
        sigma = statistics.stdev(members)  # Bessel's correction
        total = sum(
            math.tanh(((r_i - rewards[j]) / (distances[i][j] + eps)) / sigma)
            for j in group
            if j != i
        )
        out.append(total / (len(group) - 1))
    return out


def test_matches_loop():
    torch.manual_seed(0)
    rewards = [0.2, 0.9, 0.5, 0.1, 0.7, 0.3, 0.3, 0.8]
    group_ids = [5, 5, 5, 2, 2, 2, 9, 9]
    d = torch.rand(8, 8)
    d = (d + d.T) / 2
    d.fill_diagonal_(0)
    d[0, 3] = d[3, 0] = float("nan")  # across groups: never read
    got = compute_advantages(
        "srpo", torch.tensor(rewards), torch.tensor(group_ids), distances=d, eps=1e-6
    )
    want = loop_srpo(rewards, group_ids, d.tolist())
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)


def test_hand_computed_pair():
    # Two members, R = (1, 0), D = 0.5: σ = 1/√2, S_12 = 2 → A_1 = tanh(2√2), A_2 = −A_1.
    got = compute_advantages(
        "srpo", torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), distances=torch.full((2, 2), 0.5)
    )
    s = (1 / (0.5 + 1e-6)) / (1 / math.sqrt(2))
    assert got.tolist() == pytest.approx([math.tanh(s), -math.tanh(s)], abs=1e-6)


def test_constant_group_and_singleton_are_exactly_zero():
    got = compute_advantages(
        "srpo",
        torch.tensor([0.3, 0.3, 0.3, 1.0, 0.4]),
        torch.tensor([0, 0, 0, 1, 2]),
        distances=torch.zeros(5, 5),
    )
    assert got[:3].eq(0).all() and got[3] == 0 and got[4] == 0


def test_smaller_distance_larger_advantage():
    # Same reward gap: the rollout closer to the better one in ranking space moves less far
    # for it, so its pair term is larger in magnitude (before tanh saturates).
    r = torch.tensor([0.6, 0.4, 0.4])
    d = torch.tensor([[0.0, 0.9, 0.1], [0.9, 0.0, 0.5], [0.1, 0.5, 0.0]])
    a = compute_advantages("srpo", r, torch.zeros(3, dtype=torch.long), distances=d)
    assert a[2] < a[1] < 0 < a[0]


def test_bad_distances():
    with pytest.raises(ValueError, match=r"\[N, N\]"):
        compute_advantages(
            "srpo", torch.zeros(3), torch.zeros(3, dtype=torch.long), distances=torch.zeros(2, 2)
        )
    bad = torch.zeros(2, 2)
    bad[0, 1] = -1
    with pytest.raises(ValueError, match=">= 0"):
        compute_advantages(
            "srpo", torch.tensor([0.0, 1.0]), torch.zeros(2, dtype=torch.long), distances=bad
        )
