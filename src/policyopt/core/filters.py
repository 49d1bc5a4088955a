"""Group filters: which prompt groups carry a learning signal.

A filter maps (rewards [N], group_ids [N]) to a keep mask [N] that is constant within a
group. DAPO's dynamic sampling keeps groups whose rewards are not all equal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from policyopt.core.registry import Registry

GroupFilter = Callable[..., torch.Tensor]
GROUP_FILTERS: Registry[GroupFilter] = Registry("group filter")


def group_min_max(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample min and max of its group's rewards."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if len(inverse) else 0
    r = rewards.float()
    lo = torch.full((n_groups,), float("inf")).scatter_reduce(0, inverse, r, "amin")
    hi = torch.full((n_groups,), float("-inf")).scatter_reduce(0, inverse, r, "amax")
    return lo[inverse], hi[inverse]


@GROUP_FILTERS.register("nonconstant")
def keep_nonconstant(
    rewards: torch.Tensor, group_ids: torch.Tensor, tol: float = 1e-8
) -> torch.Tensor:
    """DAPO: drop groups whose rewards are all equal (all right or all wrong); their GRPO
    advantages are all zero and only dilute the batch."""
    lo, hi = group_min_max(rewards, group_ids)
    return (hi - lo) > tol
