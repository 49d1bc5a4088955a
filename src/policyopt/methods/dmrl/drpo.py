"""DRPO, DMRL's dual-relative advantage (SPEC §7), as the `drpo` advantage estimator.

For a group g of G candidate edits with predicted long-term rewards R_i, the control's
predicted reward R0_i (the best configuration so far, the A/B test's other arm) and the
edit cost C_i (`edit_cost.py`):

    A_i = α (R_i − med_g) / (1.4826 · MAD_g + δ)          robust group term
        + (1 − α) (R_i − R0_i) / (|R0_i| + δ)             control term (relative lift)
        − λ_edit · C_i                                      edit cost

med_g is the group's median (the mean of the two middle values for even G) and
MAD_g = median_g |R_i − med_g|; 1.4826 · MAD estimates the standard deviation of normal data.

One choice the paper leaves open, documented here: when MAD_g = 0 but the group is not
constant (more than half the candidates tie, e.g. several malformed edits scored 0), the
robust term would be (R_i − med_g)/δ, of order 1e6. There the scale falls back to
1.2533 · mean_g |R_i − med_g| (the mean absolute deviation's normal-consistency constant,
the usual fallback of the modified z-score, Iglewicz & Hoaglin 1993). A constant group's
robust term is exactly 0.

Ablations (the paper's Table 4) are options: `robust=False` replaces the robust term by the
plain z-score (R_i − mean_g)/(std_g + δ); `alpha=1` drops the control term; `lambda_edit=0`
drops the edit cost.
"""

from __future__ import annotations

import torch
from torch import Tensor

from policyopt.core.advantages import ADVANTAGES, group_index, group_mean_std, group_sum
from policyopt.core.structure import needs

MAD_TO_STD = 1.4826  # 1 / Φ⁻¹(3/4): MAD of normal data times this is its std
MEAN_AD_TO_STD = 1.2533  # sqrt(π/2): mean absolute deviation of normal data times this
ALPHA = 0.5  # unpublished; the brief's default
LAMBDA_EDIT = 0.1  # unpublished; documented default (docs/methods/dmrl.md)
DELTA = 1e-6


def group_median(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Median of each group [num_groups]; the mean of the two middle values for even sizes."""
    out = values.new_empty(num_groups)
    for g in range(num_groups):
        v = values[index == g].sort().values
        n = v.numel()
        out[g] = (v[(n - 1) // 2] + v[n // 2]) / 2
    return out


def robust_scores(rewards: Tensor, group_ids: Tensor, delta: float = DELTA) -> Tensor:
    """(R_i − med_g) / (1.4826 · MAD_g + δ) [N], with the MAD = 0 fallback above."""
    index, num_groups = group_index(group_ids)
    med = group_median(rewards, index, num_groups)[index]
    dev = (rewards - med).abs()
    mad = group_median(dev, index, num_groups)[index]
    count = group_sum(torch.ones_like(rewards), index, num_groups)[index]
    mean_ad = group_sum(dev, index, num_groups)[index] / count
    scale = torch.where(mad > 0, MAD_TO_STD * mad, MEAN_AD_TO_STD * mean_ad)
    return torch.where(dev > 0, (rewards - med) / (scale + delta), 0.0)


def _as_vector(name: str, value: Tensor | None, like: Tensor) -> Tensor:
    if value is None:
        raise ValueError(
            f"advantage 'drpo' needs {name} [N] (produced by the DMRL reward function "
            "'dmrl_lrp' as structure); got none"
        )
    value = torch.as_tensor(value, dtype=like.dtype)
    if value.shape != like.shape:
        raise ValueError(
            f"advantage 'drpo': {name} must have shape {tuple(like.shape)} (one per rollout), "
            f"got {tuple(value.shape)}"
        )
    if not torch.isfinite(value).all():
        raise ValueError(f"advantage 'drpo': {name} must be finite")
    return value


def _as_float(name: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(
            f"advantage 'drpo': option {name} must be a number, got {value!r}"
        ) from None


@ADVANTAGES.register("drpo")
@needs("control_rewards", "edit_costs")
def drpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    control_rewards: Tensor | None = None,
    edit_costs: Tensor | None = None,
    alpha: float = ALPHA,
    lambda_edit: float = LAMBDA_EDIT,
    delta: float = DELTA,
    robust: bool = True,
) -> Tensor:
    """DRPO advantages [N] (module docstring); control_rewards and edit_costs are [N]."""
    # Options may arrive as strings from YAML (PyYAML reads `1e-6` as a string).
    alpha, lambda_edit, delta = (
        _as_float(k, v)
        for k, v in (("alpha", alpha), ("lambda_edit", lambda_edit), ("delta", delta))
    )
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"advantage 'drpo': alpha must be in [0, 1], got {alpha}")
    r0 = _as_vector("control_rewards", control_rewards, rewards)
    cost = _as_vector("edit_costs", edit_costs, rewards)
    if robust:
        group_term = robust_scores(rewards, group_ids, delta)
    else:
        mean, std, _ = group_mean_std(rewards, group_ids)
        group_term = torch.where(std > 0, (rewards - mean) / (std + delta), 0.0)
    control_term = (rewards - r0) / (r0.abs() + delta)
    return alpha * group_term + (1 - alpha) * control_term - lambda_edit * cost
