"""GAR rewards: centring over the correct rollouts of a prompt, by hand; anchor aggregation."""

import math

import pytest
import torch

from policyopt.methods.gar import aggregate_anchors, gar_rewards

NAN = math.nan


def test_centring_by_hand():
    # group 7 (interleaved with others): correct b = 0.5, 0.2, 0.8 -> mean 0.5;
    #   b̂ = 0, -0.3, 0.3 -> rewards 1, 1, 1 + 0.5 * 0.3 = 1.15; its wrong rollout (b 0.9) -> 0
    # group 3: one correct, b = 0.4 -> not centred: 1 + 0.5 * 0.4 = 1.2; wrong -> 0
    # group 5: one correct with b = -0.3 -> 1 + 0 = 1.0
    # group 9: none correct (cosines NaN: never computed) -> 0, 0
    correct = torch.tensor([1, 1, 0, 1, 0, 1, 1, 0, 0, 0], dtype=torch.bool)
    cosine = torch.tensor([0.5, 0.4, 0.9, 0.2, NAN, 0.8, -0.3, NAN, NAN, NAN])
    groups = torch.tensor([7, 3, 7, 7, 3, 7, 5, 9, 9, 9])
    expected = torch.tensor([1.0, 1.2, 0.0, 1.0, 0.0, 1.15, 1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(gar_rewards(correct, cosine, groups), expected)
    # r_base 2, beta 1: 2 + max(0, b̂)
    expected = torch.tensor([2.0, 2.4, 0.0, 2.0, 0.0, 2.3, 2.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(gar_rewards(correct, cosine, groups, r_base=2.0, beta=1.0), expected)


def test_two_correct_split_symmetrically_and_equal_cosines_give_no_bonus():
    correct = torch.tensor([True, True, True, True])
    cosine = torch.tensor([0.1, 0.7, 0.3, 0.3])
    groups = torch.tensor([0, 0, 1, 1])
    # group 0: mean 0.4 -> b̂ = -0.3, +0.3; group 1: b̂ = 0, 0
    expected = torch.tensor([1.0, 1.15, 1.0, 1.0])
    torch.testing.assert_close(gar_rewards(correct, cosine, groups), expected)


def test_shape_mismatch():
    with pytest.raises(ValueError, match="same"):
        gar_rewards(torch.ones(3, dtype=torch.bool), torch.zeros(2), torch.zeros(3))


def test_aux_residual_aggregation():
    main = torch.tensor([0.2, 0.6, NAN, 0.3, -0.4])
    aux = torch.tensor([0.6, 0.2, 0.3, NAN, 0.0])
    # 0.2 + 0.5 * (0.6 - 0.2) = 0.4; aux below main: 0.6; no main: aux; no aux: main;
    # -0.4 + 0.5 * 0.4 = -0.2
    expected = torch.tensor([0.4, 0.6, 0.3, 0.3, -0.2])
    torch.testing.assert_close(aggregate_anchors(main, aux), expected)
    torch.testing.assert_close(aggregate_anchors(main, aux, weight=1.0)[0], torch.tensor(0.6))
