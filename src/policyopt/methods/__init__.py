"""Methods: one module per paper, each registering its parts and presets by name."""

from policyopt.methods import (
    baselines,  # noqa: F401  (registers the baseline presets)
    datpo,  # noqa: F401
    dmrl,  # noqa: F401
    docpo,  # noqa: F401
    gar,  # noqa: F401
    hispo,  # noqa: F401
    srpo,  # noqa: F401
)
from policyopt.methods.presets import PRESETS, register_preset

__all__ = ["PRESETS", "register_preset"]
