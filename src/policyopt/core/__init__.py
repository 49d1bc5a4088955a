"""Pure tensor functions of policy optimisation: advantages, losses, aggregation, KL, pass@k.

No model, no I/O, no config objects: the part to check against the papers' formulas, and
the part other trainers can import on its own.

The names below load on first use (PEP 562), so that torch-free modules of this package
(`policyopt.core.stats`) import without torch: the cli's tables use them, and
`policyopt --help` must start in well under a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policyopt.core.advantages import (
        ADVANTAGES,
        compute_advantages,
        estimator_with_metrics,
    )
    from policyopt.core.aggregation import AGG_MODES, aggregate, global_normalisers
    from policyopt.core.evaluation import avg_at_k, maj_at_k, pass_at_k, pass_at_k_curve
    from policyopt.core.kl import KL_ESTIMATORS, kl_penalty
    from policyopt.core.losses import (
        POLICY_LOSSES,
        LossInputs,
        Normalisers,
        compute_policy_loss,
    )

_HOME = {
    "ADVANTAGES": "advantages",
    "compute_advantages": "advantages",
    "estimator_with_metrics": "advantages",
    "AGG_MODES": "aggregation",
    "aggregate": "aggregation",
    "global_normalisers": "aggregation",
    "avg_at_k": "evaluation",
    "maj_at_k": "evaluation",
    "pass_at_k": "evaluation",
    "pass_at_k_curve": "evaluation",
    "KL_ESTIMATORS": "kl",
    "kl_penalty": "kl",
    "POLICY_LOSSES": "losses",
    "LossInputs": "losses",
    "Normalisers": "losses",
    "compute_policy_loss": "losses",
}

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "LossInputs",
    "Normalisers",
    "POLICY_LOSSES",
    "aggregate",
    "avg_at_k",
    "compute_advantages",
    "compute_policy_loss",
    "estimator_with_metrics",
    "global_normalisers",
    "kl_penalty",
    "maj_at_k",
    "pass_at_k",
    "pass_at_k_curve",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'policyopt.core' has no attribute {name!r}")
    # The "hispo" loss registers itself in POLICY_LOSSES from its own module: load it with
    # any public name, so the registries are complete whichever name comes first.
    importlib.import_module("policyopt.core.segment_loss")
    value = getattr(importlib.import_module(f"policyopt.core.{home}"), name)
    globals()[name] = value
    return value
