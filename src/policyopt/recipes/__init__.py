"""Recipes: named YAML configs shipped with the package, and the pipelines that run them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml


def recipe_names() -> list[str]:
    root = resources.files("policyopt.recipes")
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def recipe_path(name: str) -> Path:
    """A shipped recipe by name, or a path to a YAML file."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if not path.exists():
            raise FileNotFoundError(f"recipe file {name} does not exist")
        return path
    path = Path(str(resources.files("policyopt.recipes") / f"{name}.yaml"))
    if not path.exists():
        raise KeyError(f"unknown recipe {name!r}; shipped recipes: {', '.join(recipe_names())}")
    return path


def recipe_dict(name: str) -> dict[str, Any]:
    """A recipe's config as a dict, with its `base:` recipe (if any) merged underneath."""
    from policyopt.trainer.config import ConfigError, deep_merge

    path = recipe_path(name)
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    base = raw.pop("base", None)
    if base is None:
        return raw
    merged = recipe_dict(base)
    other_task = raw.get("task", {}).get("name")
    if other_task is not None and other_task != merged.get("task", {}).get("name"):
        # Task options belong to their task: a recipe that changes the task starts from
        # none of the base's (the grpo recipe's arithmetic options mean nothing to docparse).
        merged.get("task", {}).pop("options", None)
    return deep_merge(merged, raw)
