"""GAR (arXiv 2609.03342): gradient-aligned rewards from the LM head's gradient signal.

`gradient_signal` / `batched_gradient_signal` (signal.py), `gar_rewards` (rewards.py), the
`gar` reward shaper (shaper.py, composes with any preset: `reward.shapers=[{name: gar}]`),
the authors' reward post-processing (think_format.py), every default (defaults.py), and the
presets `gar` = GRPO + the shaper (SPEC §3 steps 1-6) and `gar_authors` = GRPO + the shaper
with the options of the authors' slime patch (SPEC §3 step 7; defaults.AUTHORS_OPTIONS).
"""

from policyopt.methods import baselines  # noqa: F401  (the grpo preset, read below)
from policyopt.methods.gar.defaults import AUTHORS_OPTIONS
from policyopt.methods.gar.rewards import aggregate_anchors, gar_rewards
from policyopt.methods.gar.shaper import GARShaper
from policyopt.methods.gar.signal import (
    batched_gradient_signal,
    gradient_signal,
    output_layer,
    prediction_error_factor,
)
from policyopt.methods.gar.think_format import (
    anchor_think_text,
    parse_strict,
    think_length_penalty,
    think_thresholds,
)
from policyopt.methods.presets import PRESETS, register_preset

_GRPO = {k: v for k, v in PRESETS.get("grpo")["algorithm"].items() if k != "name"}
register_preset("gar", {"algorithm": _GRPO, "reward": {"shapers": [{"name": "gar"}]}})
register_preset(
    "gar_authors",
    {"algorithm": _GRPO, "reward": {"shapers": [{"name": "gar", "options": AUTHORS_OPTIONS}]}},
)

__all__ = [
    "AUTHORS_OPTIONS",
    "GARShaper",
    "aggregate_anchors",
    "anchor_think_text",
    "batched_gradient_signal",
    "gar_rewards",
    "gradient_signal",
    "output_layer",
    "parse_strict",
    "prediction_error_factor",
    "think_length_penalty",
    "think_thresholds",
]
