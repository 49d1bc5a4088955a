"""Recipes: named YAML configs shipped with the package, and the pipelines that run them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policyopt.config.schema import Config


def recipe_names() -> list[str]:
    root = resources.files("policyopt.recipes")
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def recipe_path(name: str, relative_to: Path | None = None) -> Path:
    """A shipped recipe by name, or a path to a YAML file (a relative path is looked up next
    to `relative_to` first, the file that names it as its base)."""
    from policyopt.config.load import ConfigError

    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if relative_to is not None and not path.is_absolute():
            beside = relative_to.parent / path
            path = beside if beside.exists() else path
        if not path.is_file():
            raise ConfigError(f"recipe file {name} does not exist")
        return path
    path = Path(str(resources.files("policyopt.recipes") / f"{name}.yaml"))
    if not path.exists():
        # Imported here: `policyopt.core` imports torch, which `policyopt --help` must not.
        from policyopt.core.registry import unknown_name_message

        raise ConfigError(unknown_name_message("recipe", name, recipe_names()))
    return path


def recipe_dict(
    name: str, relative_to: Path | None = None, seen: tuple[Path, ...] = ()
) -> dict[str, Any]:
    """A recipe's config as a dict, with its `base:` recipe (if any) merged underneath."""
    from policyopt.config.load import (
        ConfigError,
        deep_merge,
        drop_replaced_options,
        read_yaml,
    )

    path = recipe_path(name, relative_to)
    if path.resolve() in seen:
        chain = " -> ".join(str(p) for p in (*seen, path.resolve()))
        raise ConfigError(f"base: recipes form a cycle: {chain}")
    raw = read_yaml(path)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a recipe name or a YAML path, got {base!r}")
    merged = recipe_dict(base, path, (*seen, path.resolve()))
    # Options belong to their part: a recipe that changes the task (or the strategy, the
    # advantage, the loss) starts from none of the base's options for it.
    drop_replaced_options(merged, raw)
    return deep_merge(merged, raw)


def _presets() -> dict:
    """The method presets, imported only when a name is not a recipe (the methods import
    torch: a shipped recipe's config errors come back without it)."""
    from policyopt.methods import PRESETS

    return PRESETS


def recipe_config(
    recipe: str, overrides: list[str], output_dir: str | None, seed: int | None
) -> Config:
    """The config of a shipped recipe (or of a method preset over the grpo recipe, for a
    method without one), with the overrides, output directory and seed."""
    from policyopt.config.load import load_config

    extra = list(overrides)
    if output_dir is not None:
        extra.append(f"train.output_dir={output_dir}")
    if seed is not None:
        extra.append(f"train.seed={seed}")
    if recipe not in recipe_names() and recipe in _presets():
        # A method without a recipe of its own: its preset over the default recipe.
        base = recipe_dict("grpo")
        base["algorithm"] = {"name": recipe}
    else:
        base = recipe_dict(recipe)
    return load_config(None, extra, base=base)
