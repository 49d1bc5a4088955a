"""DATPO's difficulty-adaptive budget (SPEC §4.2): harder prompts grow bigger trees."""

from __future__ import annotations

import math

# ceil(x - tol): a product that is an integer up to rounding (4 * (1 - 0.75)) is not rounded up.
_TOL = 1e-9


def adaptive_budget(v_root: float, k_max: int, b_max: int) -> tuple[int, int]:
    """(K̂, B̂) = (ceil(K_max (1 − V)), ceil(B_max (1 − V))): fork points per base trajectory
    and branches per fork point, from V = V(root), the mean reward of the base rollouts.

    V is clamped to [0, 1] (rewards outside it would ask for more than the maximum or for a
    negative budget); V = 1 gives (0, 0): no tree, the base rollouts are the whole group.
    """
    if k_max < 0 or b_max < 0:
        raise ValueError(f"adaptive_budget: k_max and b_max must be >= 0, got {k_max}, {b_max}")
    if not math.isfinite(v_root):
        raise ValueError(f"adaptive_budget: v_root must be finite, got {v_root}")
    gap = 1.0 - min(max(v_root, 0.0), 1.0)  # 1 − V
    return math.ceil(k_max * gap - _TOL), math.ceil(b_max * gap - _TOL)
