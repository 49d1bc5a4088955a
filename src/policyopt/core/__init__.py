"""Pure tensor functions of policy optimisation: advantages, losses, aggregation, KL, pass@k.

No model, no I/O, no config objects: the part to check against the papers' formulas, and
the part other trainers can import on its own.
"""

from policyopt.core import segment_loss  # noqa: F401  (registers the "hispo" loss)
from policyopt.core.advantages import ADVANTAGES, advantages_and_metrics, compute_advantages
from policyopt.core.aggregation import AGG_MODES, aggregate, global_normalisers
from policyopt.core.evaluation import avg_at_k, maj_at_k, pass_at_k, pass_at_k_curve
from policyopt.core.kl import KL_ESTIMATORS, kl_penalty
from policyopt.core.losses import POLICY_LOSSES, LossInputs, Normalisers, compute_policy_loss

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "LossInputs",
    "Normalisers",
    "POLICY_LOSSES",
    "advantages_and_metrics",
    "aggregate",
    "avg_at_k",
    "compute_advantages",
    "compute_policy_loss",
    "global_normalisers",
    "kl_penalty",
    "maj_at_k",
    "pass_at_k",
    "pass_at_k_curve",
]
