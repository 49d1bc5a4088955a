"""Per-token KL penalty estimators between the policy and a reference policy.

With d_t = log π_ref(y_t) − log π_θ(y_t) for tokens y_t sampled from π_θ (Schulman, "Approximating
KL divergence", 2020), each an estimator of KL(π_θ || π_ref):

- `k1`: −d = log π_θ − log π_ref (unbiased, high variance, can be negative).
- `k2`: ½ d² (biased, low variance, ≥ 0).
- `k3` (alias `low_var_kl`, GRPO's choice): e^d − d − 1 (unbiased, ≥ 0). As in verl, d is
  clamped to [−20, 20] before the exponential and the result to [−10, 10], so that one token
  the policy has drifted far from cannot blow up the loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from policyopt.core.registry import Registry

KLFn = Callable[[Tensor, Tensor], Tensor]

# name -> estimator(logp [N, T], ref_logp [N, T]) -> per-token penalty [N, T]
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token KL penalty of the same shape as `logp`; aggregate it like a token loss."""
    fn = KL_ESTIMATORS.get(estimator)
    if not isinstance(logp, Tensor) or not isinstance(ref_logp, Tensor):
        raise ValueError("logp and ref_logp must be tensors")
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must have the same shape"
        )
    return fn(logp, ref_logp)


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """log π_θ − log π_ref."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """½ (log π_θ − log π_ref)²."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """e^d − d − 1 with d = log π_ref − log π_θ (clamped, see the module docstring)."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS.register("k3")(kl_k3)
KL_ESTIMATORS.register("low_var_kl")(kl_k3)
