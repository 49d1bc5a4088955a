"""Method presets: a method is named config values over the five plug points.

A preset is a nested dict merged under the user's config (the user's explicit values win),
so each part of a method stays switchable on its own.
"""

from __future__ import annotations

from typing import Any

from policyopt.core.registry import Registry

PRESETS: Registry[dict[str, Any]] = Registry("method preset")


def register_preset(name: str, values: dict[str, Any]) -> None:
    """Register `values` (nested config keys) as preset `name`; `algorithm.name` is set."""
    algorithm = {"name": name, **values.get("algorithm", {})}
    PRESETS.register(name)({**values, "algorithm": algorithm})
