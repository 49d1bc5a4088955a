"""GAR (arXiv 2609.03342): gradient-aligned rewards from the LM head's gradient signal.

`gradient_signal` / `batched_gradient_signal` (signal.py), `gar_rewards` (rewards.py), the
`gar` reward shaper (shaper.py, composes with any preset: `reward.shapers=[{name: gar}]`),
and the preset `gar` = GRPO + the shaper.
"""

from policyopt.methods import baselines  # noqa: F401  (the grpo preset, read below)
from policyopt.methods.gar.rewards import aggregate_anchors, gar_rewards
from policyopt.methods.gar.shaper import GARShaper
from policyopt.methods.gar.signal import (
    batched_gradient_signal,
    gradient_signal,
    output_layer,
    prediction_error_factor,
)
from policyopt.methods.presets import PRESETS, register_preset

register_preset(
    "gar",
    {
        "algorithm": {k: v for k, v in PRESETS.get("grpo")["algorithm"].items() if k != "name"},
        "reward": {"shapers": [{"name": "gar"}]},
    },
)

__all__ = [
    "GARShaper",
    "aggregate_anchors",
    "batched_gradient_signal",
    "gar_rewards",
    "gradient_signal",
    "output_layer",
    "prediction_error_factor",
]
