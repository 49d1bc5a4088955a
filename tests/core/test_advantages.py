"""Advantage estimators against hand-worked numbers and a loop-over-groups reference."""

import pytest
import torch

from policyopt.core import ADVANTAGES, compute_advantages

torch.set_num_threads(1)


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def ids(*xs):
    return torch.tensor(xs)


def test_grpo_one_group_by_hand():
    # [1, 0, 0, 1]: mean 0.5, deviations ±0.5, Bessel var = 4·0.25/3 = 1/3, std 0.57735
    # -> Â = ±0.5/0.57735 = ±0.866025
    adv = compute_advantages("grpo", t(1, 0, 0, 1), ids(7, 7, 7, 7))
    assert torch.allclose(adv, t(1, -1, -1, 1) * 0.8660254, atol=1e-5)


def test_grpo_unsorted_noncontiguous_groups_by_hand():
    # group 10: rewards [1, 0, 2]: mean 1, var (0 + 1 + 1)/2 = 1, std 1 -> [0, -1, 1]
    # group -3: rewards [2, 4]:    mean 3, var (1 + 1)/1 = 2, std 1.414214 -> [-0.707107, 0.707107]
    adv = compute_advantages("grpo", t(1, 2, 0, 4, 2), ids(10, -3, 10, -3, 10), eps=0.0)
    assert torch.allclose(adv, t(0, -0.7071068, -1, 0.7071068, 1), atol=1e-6)


def test_grpo_eps_option():
    # [0, 1]: mean 0.5, std 0.707107; eps = 1 -> ±0.5/1.707107 = ±0.292893
    adv = compute_advantages("grpo", t(0, 1), ids(0, 0), eps=1.0)
    assert torch.allclose(adv, t(-0.2928932, 0.2928932), atol=1e-6)


def test_grpo_singleton_and_constant_groups_are_exactly_zero():
    # 0.1 three times: the computed mean can differ from 0.1 by rounding; must still be 0.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 1.0, 0.0], dtype=torch.float32)
    adv = compute_advantages("grpo", rewards, ids(1, 1, 1, 2, 3, 3))
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert torch.isfinite(adv).all()
    assert adv[4] > 0 > adv[5]


def test_grpo_matches_loop_reference():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(40, generator=g, dtype=torch.float64)
    group_ids = torch.randint(-5, 50, (40,), generator=g) * 3  # sparse, unsorted ids
    adv = compute_advantages("grpo", rewards, group_ids)
    for gid in group_ids.unique():
        members = group_ids == gid
        r = rewards[members]
        if r.numel() == 1:
            expected = torch.zeros(1, dtype=torch.float64)
        else:
            expected = (r - r.mean()) / (r.std() + 1e-6)
        assert torch.allclose(adv[members], expected, atol=1e-10)


def test_dr_grpo_and_unscaled_grpo_by_hand():
    # group 0: [1, 0, 2] mean 1 -> [0, -1, 1]; group 5: [3] -> 0
    rewards, group_ids = t(1, 0, 2, 3), ids(0, 0, 0, 5)
    expected = t(0, -1, 1, 0)
    assert torch.allclose(compute_advantages("dr_grpo", rewards, group_ids), expected)
    unscaled = compute_advantages("grpo", rewards, group_ids, scale_by_std=False)
    assert torch.allclose(unscaled, expected)


def test_rloo_by_hand():
    # group 0: [1, 0, 2]: 1 − (0+2)/2 = 0; 0 − (1+2)/2 = −1.5; 2 − (1+0)/2 = 1.5
    # group 9: [4] alone -> 0
    adv = compute_advantages("rloo", t(1, 0, 2, 4), ids(0, 0, 0, 9))
    assert torch.allclose(adv, t(0, -1.5, 1.5, 0))


def test_rloo_is_rescaled_group_centering():
    # Σ_{j≠i} R_j/(G−1) = (G mean − R_i)/(G−1), so R_i − that = G/(G−1) (R_i − mean)
    g = torch.Generator().manual_seed(1)
    rewards = torch.rand(12, generator=g, dtype=torch.float64)
    group_ids = torch.arange(12) // 4  # G = 4
    expected = 4 / 3 * compute_advantages("dr_grpo", rewards, group_ids)
    assert torch.allclose(compute_advantages("rloo", rewards, group_ids), expected)


def test_reinforce_pp_batch_normalisation_by_hand():
    # batch [1, 2, 3, 6]: mean 3, deviations [−2, −1, 0, 3], var (4+1+0+9)/3 = 14/3,
    # std 2.160247 -> [−0.925820, −0.462910, 0, 1.388730] (groups do not matter)
    adv = compute_advantages("reinforce_pp", t(1, 2, 3, 6), ids(0, 0, 1, 1), eps=0.0)
    assert torch.allclose(adv, t(-0.9258201, -0.4629100, 0, 1.3887301), atol=1e-6)


def test_reinforce_pp_group_baseline_by_hand():
    # groups [1, 3] and [2, 6]: means 2 and 4 -> x = [−1, 1, −2, 2]; batch std of x:
    # mean 0, var (1+1+4+4)/3 = 10/3, std 1.825742 -> [−0.547723, 0.547723, −1.095445, 1.095445]
    adv = compute_advantages(
        "reinforce_pp", t(1, 3, 2, 6), ids(0, 0, 1, 1), eps=0.0, group_baseline=True
    )
    assert torch.allclose(adv, t(-0.5477226, 0.5477226, -1.0954451, 1.0954451), atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_no_nan_on_degenerate_batches(name):
    for rewards, group_ids in [(t(1.0), ids(0)), (t(0.3, 0.3, 0.3), ids(4, 4, 4))]:
        adv = compute_advantages(name, rewards, group_ids)
        assert adv.tolist() == [0.0] * len(rewards)


def test_integer_rewards_are_accepted():
    adv = compute_advantages("dr_grpo", torch.tensor([1, 0]), ids(0, 0))
    assert adv.dtype == torch.float32 and adv.tolist() == [0.5, -0.5]


def test_registry_lists_estimators():
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp"} <= set(ADVANTAGES.names())


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError, match="valid names: .*dr_grpo.*grpo.*reinforce_pp.*rloo"):
        compute_advantages("gpro", t(1, 0), ids(0, 0))


def test_unknown_option_lists_valid_options():
    with pytest.raises(TypeError, match="'scale'.*valid options: eps, scale_by_std"):
        compute_advantages("grpo", t(1, 0), ids(0, 0), scale=False)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="group_ids must be a tensor of the same shape"):
        compute_advantages("grpo", t(1, 0), ids(0, 0, 1))
    with pytest.raises(ValueError, match="group_ids must hold integers"):
        compute_advantages("grpo", t(1, 0), t(0, 0))
    with pytest.raises(ValueError, match="rewards must be a 1-D"):
        compute_advantages("grpo", torch.zeros(2, 2), ids(0, 0))
    with pytest.raises(ValueError, match=r"rewards\[1\] = nan"):
        compute_advantages("grpo", t(1, float("nan")), ids(0, 0))
