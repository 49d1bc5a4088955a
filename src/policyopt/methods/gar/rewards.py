"""GAR's rewards from cosines with the expert anchor (SPEC §3, steps 4-6).

b_i = v_i^T v_a (best over the problem's anchors). Among the correct rollouts of a prompt:

    b̂_i = b_i − mean_{correct j} b_j     (b̂_i = b_i when only one rollout is correct)
    R_i = r_base + β · max(0, b̂_i)       correct
    R_i = 0                               wrong

Auxiliary anchors (a second set of reference solutions, e.g. teacher rollouts) are folded in
per rollout before the centring, by one of the rules of the authors' public code
(github.com/LQgdwind/GAR, gar/online_reward.py `_aggregate_bonus`; `--gar-anchor-aggregation`,
default `aux_residual`, `--gar-aux-weight` w = 0.5), with b_main, b_aux the best cosines over
the main and the auxiliary anchors:

    aux_residual   b_i = b_main + w · max(0, b_aux − b_main)   (aux can only raise b_i)
    aux_max        b_i = max(b_main, w · b_aux)
    real_only      b_i = b_main
    any rule       b_i = b_aux when the rollout's problem has no main anchor
"""

from __future__ import annotations

import torch

from policyopt.methods.gar.defaults import (
    ANCHOR_AGGREGATION,
    ANCHOR_AGGREGATIONS,
    AUX_WEIGHT,
    BETA,
    R_BASE,
)

__all__ = ["AUX_WEIGHT", "BETA", "R_BASE", "aggregate_anchors", "gar_rewards"]


def gar_rewards(
    correct: torch.Tensor,
    cosine: torch.Tensor,
    group_ids: torch.Tensor,
    r_base: float = R_BASE,
    beta: float = BETA,
) -> torch.Tensor:
    """GAR rewards [N] (module docstring). `cosine` of wrong rollouts is ignored (may be NaN)."""
    if not (correct.shape == cosine.shape == group_ids.shape and correct.dim() == 1):
        raise ValueError(
            f"gar_rewards: correct {tuple(correct.shape)}, cosine {tuple(cosine.shape)} and "
            f"group_ids {tuple(group_ids.shape)} must be the same [N]"
        )
    correct = correct.bool()
    b = torch.where(correct, cosine.float(), torch.zeros_like(cosine, dtype=torch.float32))
    _, group = torch.unique(group_ids.to(b.device), return_inverse=True)
    n_groups = int(group.max()) + 1 if len(group) else 0
    zeros = torch.zeros(n_groups, device=b.device)
    count = zeros.index_add(0, group, correct.float())  # correct rollouts per group
    total = zeros.index_add(0, group, b)  # Σ_{correct j} b_j
    mean = torch.where(count > 1, total / count.clamp(min=1), torch.zeros_like(total))
    centred = b - mean[group]  # b̂_i (b_i itself when alone)
    bonus = beta * centred.clamp(min=0.0)
    return torch.where(correct, r_base + bonus, torch.zeros_like(bonus))


def aggregate_anchors(
    main: torch.Tensor,
    aux: torch.Tensor,
    weight: float = AUX_WEIGHT,
    mode: str = ANCHOR_AGGREGATION,
) -> torch.Tensor:
    """b_i from the best main and auxiliary cosines by rule `mode` (module docstring); NaN
    marks a missing anchor set (b_aux alone without a main anchor, b_main alone without an
    auxiliary one)."""
    if mode == "aux_residual":
        combined = main + weight * (aux - main).clamp(min=0.0)
    elif mode == "aux_max":
        combined = torch.maximum(main, weight * aux)
    elif mode == "real_only":
        combined = main
    else:
        raise ValueError(f"gar: anchor_aggregation {mode!r} is not one of {ANCHOR_AGGREGATIONS}")
    combined = torch.where(torch.isnan(aux), main, combined)
    return torch.where(torch.isnan(main), aux, combined)
