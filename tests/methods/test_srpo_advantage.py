"""The srpo advantage against a plain Python loop over the formula, and hand-worked numbers
for each distance normalisation, the temperature, the D = 0 rule and the metrics."""

import math
import statistics

import numpy as np
import pytest
import torch

from policyopt.core import ADVANTAGES, compute_advantages, estimator_with_metrics
from policyopt.methods import srpo  # noqa: F401  (registers the "srpo" advantage)


def advantages_and_metrics(name, rewards, group_ids, **options):
    return estimator_with_metrics(name, ADVANTAGES.get(name), rewards, group_ids, **options)


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
        "srpo",
        torch.tensor(rewards),
        torch.tensor(group_ids),
        distances=d,
        eps=1e-6,
        normalize="none",
    )
    want = loop_srpo(rewards, group_ids, d.tolist())
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)


def test_hand_computed_pair():
    # Two members, R = (1, 0), D = 0.5: σ = 1/√2, S_12 = 2 → A_1 = tanh(2√2), A_2 = −A_1.
    got = compute_advantages(
        "srpo",
        torch.tensor([1.0, 0.0]),
        torch.tensor([0, 0]),
        distances=torch.full((2, 2), 0.5),
        normalize="none",
    )
    s = (1 / (0.5 + 1e-6)) / (1 / math.sqrt(2))
    assert got.tolist() == pytest.approx([math.tanh(s), -math.tanh(s)], abs=1e-6)


PAIR = (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.full((2, 2), 0.5))


@pytest.mark.parametrize(
    ("options", "arg"),
    [
        # R = (1, 0), D = 0.5, σ = 1/√2. none: S = 1/0.5 = 2, S/σ = 2√2.
        ({"normalize": "none"}, 2 * math.sqrt(2)),
        # reverse with d(σ, reverse σ) = 2: D' = 0.25, S = 4, S/σ = 4√2.
        ({"normalize": "reverse", "distance_scale": torch.tensor([2.0, 2.0])}, 4 * math.sqrt(2)),
        # group_mean: the group's mean distance is 0.5, D' = 1, S = 1, S/σ = √2.
        ({"normalize": "group_mean"}, math.sqrt(2)),
        # temperature 4 on none: S/(τσ) = 2√2 / 4.
        ({"normalize": "none", "temperature": 4.0}, math.sqrt(2) / 2),
    ],
)
def test_normalisations_and_temperature_by_hand(options, arg):
    r, g, d = PAIR
    got, metrics = advantages_and_metrics("srpo", r, g, distances=d, eps=1e-9, **options)
    assert got.tolist() == pytest.approx([math.tanh(arg), -math.tanh(arg)], abs=1e-6)
    assert metrics["srpo/saturation"] == (1.0 if arg > 2 else 0.0)
    assert metrics["srpo/corr_grpo"] == pytest.approx(1.0)


# R = (1, 0, 0.5), σ = 0.5; rollouts 1 and 2 have the same ranking (D_12 = 0) but unequal
# rewards; D_01 = 0.2, D_02 = 0.4.
TRIPLE_R = torch.tensor([1.0, 0.0, 0.5])
TRIPLE_D = torch.tensor([[0.0, 0.2, 0.4], [0.2, 0.0, 0.0], [0.4, 0.0, 0.0]])


def test_zero_distance_rule_by_hand():
    got, m = advantages_and_metrics(
        "srpo",
        TRIPLE_R,
        torch.zeros(3, dtype=torch.long),
        distances=TRIPLE_D,
        normalize="none",
        eps=1e-9,
    )
    # Pair (1, 2) has D = 0: its term is 0 (not tanh(±0.5/1e-9/0.5) = ±1); G − 1 = 2 stays.
    # A_0 = (tanh(1/0.2/0.5) + tanh(0.5/0.4/0.5))/2, A_1 = tanh(−10)/2, A_2 = tanh(−2.5)/2.
    want = [(math.tanh(10) + math.tanh(2.5)) / 2, math.tanh(-10) / 2, math.tanh(-2.5) / 2]
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    # Pairs with D > 0: arguments 10, 10, 2.5, 2.5 (all saturated); 2 of the 6 pairs D = 0.
    assert m["srpo/saturation"] == 1.0
    assert m["srpo/zero_distance_pairs"] == pytest.approx(1 / 3)


def test_group_mean_by_hand_with_zero_distance():
    got, m = advantages_and_metrics(
        "srpo",
        TRIPLE_R,
        torch.zeros(3, dtype=torch.long),
        distances=TRIPLE_D,
        normalize="group_mean",
        eps=1e-9,
    )
    # Mean over the 6 ordered pairs: 2(0.2 + 0.4 + 0)/6 = 0.2, so D' = (1, 2, 0).
    # A_0 = (tanh(1/1/0.5) + tanh(0.5/2/0.5))/2, A_1 = tanh(−2)/2, A_2 = tanh(−0.5)/2.
    want = [(math.tanh(2) + math.tanh(0.5)) / 2, math.tanh(-2) / 2, math.tanh(-0.5) / 2]
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    # arguments 2 (not > 2) and 0.5: none saturated. GRPO's advantage is (1, −1, 0).
    assert m["srpo/saturation"] == 0.0
    want_corr = np.corrcoef(want, [1.0, -1.0, 0.0])[0, 1]
    assert m["srpo/corr_grpo"] == pytest.approx(want_corr, abs=1e-6)
    assert 0.9 < want_corr < 0.96  # not 1: the distances reorder the magnitudes


def test_group_mean_is_scale_free():
    r = torch.tensor([0.3, 0.9, 0.1, 0.4])
    g = torch.zeros(4, dtype=torch.long)
    d = torch.rand(4, 4, generator=torch.Generator().manual_seed(1))
    d = (d + d.T).fill_diagonal_(0)
    a = compute_advantages("srpo", r, g, distances=d, normalize="group_mean", eps=1e-9)
    b = compute_advantages("srpo", r, g, distances=37.0 * d, normalize="group_mean", eps=1e-9)
    assert torch.allclose(a, b, atol=1e-6)
    # ... while none is not.
    c = compute_advantages("srpo", r, g, distances=37.0 * d, normalize="none", eps=1e-9)
    assert not torch.allclose(a, c, atol=1e-3)


def test_reverse_needs_the_scale_and_bad_options():
    r, g, d = PAIR
    with pytest.raises(ValueError, match="distance_scale"):
        compute_advantages("srpo", r, g, distances=d, normalize="reverse")
    with pytest.raises(ValueError, match="unknown normalize"):
        compute_advantages("srpo", r, g, distances=d, normalize="mean")
    with pytest.raises(ValueError, match="temperature"):
        compute_advantages("srpo", r, g, distances=d, normalize="none", temperature=0.0)


def test_constant_group_and_singleton_are_exactly_zero():
    got = compute_advantages(
        "srpo",
        torch.tensor([0.3, 0.3, 0.3, 1.0, 0.4]),
        torch.tensor([0, 0, 0, 1, 2]),
        distances=torch.zeros(5, 5),
        normalize="none",
    )
    assert got[:3].eq(0).all() and got[3] == 0 and got[4] == 0


def test_smaller_distance_larger_advantage():
    # Same reward gap: the rollout closer to the better one in ranking space moves less far
    # for it, so its pair term is larger in magnitude (before tanh saturates).
    r = torch.tensor([0.6, 0.4, 0.4])
    d = torch.tensor([[0.0, 0.9, 0.1], [0.9, 0.0, 0.5], [0.1, 0.5, 0.0]])
    a = compute_advantages(
        "srpo", r, torch.zeros(3, dtype=torch.long), distances=d, normalize="none"
    )
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
            "srpo",
            torch.tensor([0.0, 1.0]),
            torch.zeros(2, dtype=torch.long),
            distances=bad,
            normalize="none",
        )


@pytest.mark.parametrize("seed", range(40))
def test_block_path_equals_general_path(seed):
    # Consecutive groups of one size take the [B, G, G] block path; the general [N, N] path
    # on the same rollouts, and on them shuffled (un-shuffled after), gives the same numbers.
    from policyopt.methods.srpo.advantage import _general_advantages, consecutive_block_size

    gen = torch.Generator().manual_seed(seed)
    b, g = (int(torch.randint(1, m, (1,), generator=gen)) for m in (6, 7))
    n = b * g
    rewards = torch.randint(0, 4, (n,), generator=gen).float() / 3  # ties, constant groups
    d = torch.rand(n, n, generator=gen).round(decimals=1)  # some D = 0 pairs
    d = (d + d.T) / 2
    groups = torch.arange(n) // g
    d[(torch.rand(n, n, generator=gen) < 0.1) & (groups[:, None] != groups[None, :])] = float(
        "nan"
    )  # between groups: never read
    d.fill_diagonal_(float("nan"))  # nor the diagonal
    scale = torch.rand(b, generator=gen).add(0.5).repeat_interleave(g)
    ids = groups * 7 + 3  # any distinct ids
    options = {
        "normalize": ["none", "reverse", "group_mean"][seed % 3],
        "temperature": [1.0, 0.5][seed % 2],
        "eps": 1e-6,
    }
    assert consecutive_block_size(ids) == g
    a, ma = advantages_and_metrics(
        "srpo", rewards, ids, distances=d, distance_scale=scale, **options
    )
    args = (options["normalize"], options["temperature"], options["eps"])
    general, mg = _general_advantages(rewards, ids, d, scale, *args)
    perm = torch.randperm(n, generator=gen)
    shuffled, ms = _general_advantages(
        rewards[perm], ids[perm], d[perm][:, perm], scale[perm], *args
    )
    back = torch.empty_like(shuffled)
    back[perm] = shuffled
    assert torch.allclose(a, general, atol=1e-6) and torch.allclose(a, back, atol=1e-6)
    assert ma.keys() == mg.keys()
    for key in ma:
        assert ma[key] == pytest.approx(mg[key], abs=1e-6), key
        assert ms[key] == pytest.approx(mg[key], abs=1e-6), key
    assert not a.isnan().any()


def test_block_size_detection():
    from policyopt.methods.srpo.advantage import consecutive_block_size

    assert consecutive_block_size(torch.tensor([4, 4, 1, 1, 9, 9])) == 2
    assert consecutive_block_size(torch.tensor([0, 0, 1, 1, 0, 0])) is None  # id repeats
    assert consecutive_block_size(torch.tensor([0, 0, 1, 1, 1])) is None  # unequal sizes
    assert consecutive_block_size(torch.tensor([0, 1, 0, 1])) is None  # interleaved
    assert consecutive_block_size(torch.tensor([5, 6, 7])) == 1
    assert consecutive_block_size(torch.tensor([], dtype=torch.long)) is None
