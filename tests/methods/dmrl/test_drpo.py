"""DRPO advantages against an independent numpy computation, and by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policyopt.core import compute_advantages
from policyopt.core.advantages import ADVANTAGES
from policyopt.methods.dmrl import drpo  # noqa: F401  (registers "drpo")


def numpy_drpo(r, g, r0, c, alpha, lam, delta, robust=True):
    out = np.zeros_like(r)
    for gid in np.unique(g):
        m = g == gid
        x = r[m]
        if robust:
            med = np.median(x)
            mad = np.median(np.abs(x - med))
            term = (x - med) / (1.4826 * mad + delta)
        else:
            term = (x - x.mean()) / (x.std(ddof=1) + delta)
        out[m] = alpha * term
    return out + (1 - alpha) * (r - r0) / (np.abs(r0) + delta) - lam * c


@pytest.mark.parametrize("robust", [True, False])
def test_drpo_matches_numpy(robust):
    rng = np.random.default_rng(0)
    n = 24
    r = rng.normal(1.0, 0.3, n)
    g = np.repeat([3, 1, 7], 8)  # groups of 8 (even G: median of the two middle values)
    r0 = rng.normal(1.0, 0.1, n)
    c = rng.uniform(0, 1, n)
    got = compute_advantages(
        "drpo",
        torch.tensor(r),
        torch.tensor(g),
        control_rewards=torch.tensor(r0),
        edit_costs=torch.tensor(c),
        alpha=0.3,
        lambda_edit=0.2,
        delta=1e-6,
        robust=robust,
    )
    np.testing.assert_allclose(
        got.numpy(), numpy_drpo(r, g, r0, c, 0.3, 0.2, 1e-6, robust), rtol=1e-6
    )


def test_drpo_by_hand_odd_group():
    # R = [1, 2, 4]: median 2, |R − 2| = [1, 0, 2], MAD 1; scale 1.4826.
    r = torch.tensor([1.0, 2.0, 4.0])
    r0 = torch.tensor([2.0, 2.0, 2.0])
    c = torch.tensor([0.0, 1.0, 0.5])
    got = compute_advantages(
        "drpo",
        r,
        torch.zeros(3, dtype=torch.long),
        control_rewards=r0,
        edit_costs=c,
        alpha=0.5,
        lambda_edit=0.1,
        delta=0.0,
    )
    expected = [
        0.5 * (-1 / 1.4826) + 0.5 * (-1 / 2) - 0.0,
        0.0 + 0.0 - 0.1,
        0.5 * (2 / 1.4826) + 0.5 * (2 / 2) - 0.05,
    ]
    torch.testing.assert_close(got, torch.tensor(expected))


def test_even_group_median_is_mean_of_middle_values():
    # R = [0, 1, 3, 10]: median (1 + 3)/2 = 2; |R − 2| = [2, 1, 1, 8] -> MAD (1 + 2)/2 = 1.5.
    r = torch.tensor([0.0, 1.0, 3.0, 10.0])
    zeros = torch.zeros(4)
    got = compute_advantages(
        "drpo",
        r,
        torch.zeros(4, dtype=torch.long),
        control_rewards=torch.ones(4),
        edit_costs=zeros,
        alpha=1.0,
        lambda_edit=0.0,
        delta=0.0,
    )
    torch.testing.assert_close(got, (r - 2.0) / (1.4826 * 1.5))


def test_mad_zero_falls_back_to_mean_absolute_deviation():
    # 5 of 8 tie at 0: MAD = 0; mean |R − 0| = (1 + 2 + 3)/8 = 0.75.
    r = torch.tensor([0.0, 0, 0, 0, 0, 1, 2, 3])
    got = compute_advantages(
        "drpo",
        r,
        torch.zeros(8, dtype=torch.long),
        control_rewards=torch.ones(8),
        edit_costs=torch.zeros(8),
        alpha=1.0,
        lambda_edit=0.0,
    )
    torch.testing.assert_close(got, r / (1.2533 * 0.75 + 1e-6))
    assert got.abs().max() < 10


def test_constant_group_has_only_control_and_cost_terms():
    r = torch.full((4,), 2.0)
    got = compute_advantages(
        "drpo",
        r,
        torch.zeros(4, dtype=torch.long),
        control_rewards=torch.full((4,), 1.0),
        edit_costs=torch.tensor([0.0, 1.0, 0.0, 0.0]),
        alpha=0.5,
        lambda_edit=1.0,
        delta=0.0,
    )
    torch.testing.assert_close(got, torch.tensor([0.5, -0.5, 0.5, 0.5]))


def test_drpo_declares_and_requires_its_structure():
    assert set(ADVANTAGES.get("drpo").needs) == {"control_rewards", "edit_costs"}
    with pytest.raises(ValueError, match="control_rewards"):
        compute_advantages(
            "drpo", torch.ones(2), torch.zeros(2, dtype=torch.long), edit_costs=torch.zeros(2)
        )
    with pytest.raises(ValueError, match="edit_costs must have shape"):
        compute_advantages(
            "drpo",
            torch.ones(2),
            torch.zeros(2, dtype=torch.long),
            control_rewards=torch.ones(2),
            edit_costs=torch.zeros(3),
        )


def test_numeric_options_from_yaml_strings():
    # PyYAML reads "1e-6" as a string: the option is still a number, or a clear error.
    args = ("drpo", torch.tensor([1.0, 2.0]), torch.zeros(2, dtype=torch.long))
    kw = {"control_rewards": torch.ones(2), "edit_costs": torch.zeros(2)}
    a = compute_advantages(*args, **kw, delta="1e-6")
    b = compute_advantages(*args, **kw, delta=1e-6)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="option alpha must be a number, got 'x'"):
        compute_advantages(*args, **kw, alpha="x")
