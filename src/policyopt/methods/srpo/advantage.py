"""SRPO's structure-normalised advantage (arXiv 2607.25268; SPEC §6).

For rollouts i, j of one group g of G, rewards R and distances D_ij between their rankings:

    S_ij = (R_i − R_j) / (D_ij + eps)            reward gained per unit of ranking change
    A_i  = 1/(G − 1) · Σ_{j≠i, j ∈ g} tanh(S_ij / σ_g)

σ_g the group's reward std with Bessel's correction (as `grpo`'s). A constant group, or a
group of one, carries no signal: A = 0 exactly. Only entries of D within a group are read.
D is declared structure (`needs("distances")`), made by the `ranking_distances` shaper.
"""

from __future__ import annotations

import torch
from torch import Tensor

from policyopt.core.advantages import ADVANTAGES, group_is_constant, group_mean_std
from policyopt.core.structure import needs


@ADVANTAGES.register("srpo")
@needs("distances")
def srpo_advantages(
    rewards: Tensor, group_ids: Tensor, *, distances: Tensor, eps: float = 1e-6
) -> Tensor:
    """A_i = mean over the other members j of tanh(((R_i − R_j)/(D_ij + eps)) / σ_g)."""
    n = rewards.shape[0]
    if not isinstance(distances, Tensor) or distances.shape != (n, n):
        shape = tuple(distances.shape) if isinstance(distances, Tensor) else type(distances)
        raise ValueError(f"srpo: distances must be [N, N] = [{n}, {n}], got {shape}")
    if eps <= 0:
        raise ValueError(f"srpo: eps must be > 0, got {eps}")
    _, std, count = group_mean_std(rewards, group_ids)
    same = group_ids[:, None] == group_ids[None, :]
    same.fill_diagonal_(False)
    d = distances.to(rewards.dtype)
    within = d[same]
    if within.numel() and (~torch.isfinite(within) | (within < 0)).any():
        raise ValueError("srpo: distances within a group must be finite and >= 0")
    diff = rewards[:, None] - rewards[None, :]  # R_i − R_j
    s = diff / (d.masked_fill(~same, 0.0) + eps)
    # σ_g is the same for i and j in a group; a constant group (σ = 0) is masked below.
    terms = torch.tanh(s / std.clamp(min=torch.finfo(rewards.dtype).tiny)[:, None])
    adv = (terms * same).sum(1) / (count - 1).clamp(min=1)
    return adv.masked_fill(group_is_constant(rewards, group_ids) | (count == 1), 0.0)
