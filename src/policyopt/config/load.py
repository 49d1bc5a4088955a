"""Loading a run configuration: YAML plus dotted `key=value` overrides, validated on load.

Resolution order, later wins: field defaults -> the method preset named by `algorithm.name`
(its paper's defaults, from `policyopt.methods`) -> the YAML file -> command-line overrides.
An unknown key anywhere is an error naming the nearest valid key. The schema is
`policyopt.config.schema`; the registered parts a config names are checked by
`policyopt.config.check.check_config`, the one config-time check of parts.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from policyopt.config.schema import (
    AlgorithmConfig,
    AnnotatorConfig,
    Config,
    ConfigError,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RewardFunctionConfig,
    RewardWorkersConfig,
    RolloutConfig,
    Section,
    SFTConfig,
    ShaperConfig,
    TaskConfig,
    TrainConfig,
)

__all__ = [
    "AlgorithmConfig",
    "AnnotatorConfig",
    "Config",
    "ConfigError",
    "EvalConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RewardConfig",
    "RewardFunctionConfig",
    "RewardWorkersConfig",
    "RolloutConfig",
    "SFTConfig",
    "Section",
    "ShaperConfig",
    "TaskConfig",
    "TrainConfig",
    "dump_config",
    "load_config",
    "read_yaml",
]


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> Config:
    """Resolve a config: defaults <- preset <- `base` <- YAML at `path` <- overrides."""
    raw: dict[str, Any] = copy.deepcopy(base) if base else {}
    if path is not None:
        layer = read_yaml(path)
        drop_replaced_options(raw, layer)
        deep_merge(raw, layer)
    parsed = [parse_override(item) for item in overrides or []]
    given: dict[str, Any] = {}
    for key, value in parsed:
        set_dotted(given, key, value)
    drop_replaced_options(raw, given)
    for key, value in parsed:
        set_dotted(raw, key, value, defaults=_list_defaults(raw) if _indexes(key) else None)
    check_keys(raw, Config)
    preset_name = raw.get("algorithm", {}).get("name", AlgorithmConfig().name)
    resolved = preset_values(preset_name)
    drop_replaced_options(resolved, raw)
    deep_merge(resolved, raw)
    try:
        config = Config.model_validate(resolved)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err)) from None
    # Imported here: the parts' check imports every registry (torch included), which
    # `policyopt --help` and the other config-only paths must not pay for.
    from policyopt.config.check import check_config

    check_config(config)
    return config


def _indexes(key: str) -> bool:
    return any(part.isdigit() for part in key.split("."))


def _list_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """The defaults under `raw`'s preset, as plain data: where an indexed override finds a
    list (`reward.functions`) the YAML did not give."""
    preset_name = raw.get("algorithm", {}).get("name", AlgorithmConfig().name)
    return deep_merge(Config().model_dump(mode="json"), preset_values(preset_name))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping; a syntax error names the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(describe_yaml_error(str(path), err)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections (model:, task:, ...), "
            f"got a {type(loaded).__name__}"
        )
    return loaded


def describe_yaml_error(source: str, err: yaml.YAMLError) -> str:
    """`file:line:column: invalid YAML: problem (context at line, column)`, 1-based."""
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return f"{source}: invalid YAML: {err}"
    mark = err.problem_mark
    text = f"{source}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {err.problem}"
    if err.context:
        text += f" ({err.context}"
        if err.context_mark is not None:
            cm = err.context_mark
            text += f" that starts at line {cm.line + 1}, column {cm.column + 1}"
        text += ")"
    return text


def preset_values(name: str) -> dict[str, Any]:
    from policyopt.methods import PRESETS

    try:
        return copy.deepcopy(PRESETS.get(name))
    except KeyError as err:
        raise ConfigError(f"algorithm.name: {err.args[0]}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", YAML-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, text = item.split("=", 1)
    if not text.strip():
        return key.strip(), None
    try:
        return key.strip(), yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(
            f"override {item!r}: the value {text!r} is not valid YAML ({problem}); quote it, "
            "or write a list as [a, b] and a mapping as {k: v}"
        ) from None


def set_dotted(
    raw: dict[str, Any], key: str, value: Any, defaults: dict[str, Any] | None = None
) -> None:
    """Set `a.b.c` in `raw`; a number indexes a list (`reward.functions.1.weight`), taken
    from `defaults` (the resolved defaults) when `raw` does not hold that list yet."""
    node: Any = raw
    default: Any = defaults
    parts = key.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                where = ".".join(parts[:depth])
                raise ConfigError(
                    f"override {key!r}: {where} is a list of {len(node)} entries; index it "
                    f"0 to {len(node) - 1}"
                )
            index = int(part)
            if last:
                node[index] = value
                return
            node, default = node[index], None
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {parts[depth - 1]!r} is not a section")
        if last:
            node[part] = value
            return
        default = default.get(part) if isinstance(default, dict) else None
        nxt = parts[depth + 1]
        if part not in node and nxt.isdigit() and isinstance(default, list):
            node[part] = copy.deepcopy(default)
        node = node.setdefault(part, {})


# (section, name key, option keys): a part's options belong to the part the name selects.
# A loss's clip range and aggregation are its options too: DAPO's clip_high 0.28 is a
# token-clip value, and `algorithm.loss=gspo` on the dapo preset starts from GSPO's own
# 3e-4 / 4e-4 (`policyopt.config.check.loss_settings`).
PART_OPTIONS = (
    ("rollout", "strategy", ("strategy_options",)),
    ("algorithm", "advantage", ("advantage_options",)),
    ("algorithm", "loss", ("loss_options", "agg", "clip_low", "clip_high")),
    ("task", "name", ("options",)),
)


def drop_replaced_options(lower: dict[str, Any], upper: dict[str, Any]) -> None:
    """Remove from `lower` the options of each part that `upper` replaces by another name:
    a preset's or base recipe's tree options mean nothing to `rollout.strategy=parallel`."""
    for section, name_key, option_keys in PART_OPTIONS:
        below, above = lower.get(section), upper.get(section)
        if not (isinstance(below, dict) and isinstance(above, dict)) or name_key not in above:
            continue
        default = getattr(Config.model_fields[section].default, name_key)
        if above[name_key] != below.get(name_key, default):
            for key in option_keys:
                below.pop(key, None)


def deep_merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Merge `other` into `into` recursively (other wins) and return `into`."""
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def check_keys(raw: dict[str, Any], model: type[BaseModel], prefix: str = "") -> None:
    """Unknown keys are errors that name the nearest valid key; a section given a value
    (`algorithm=grpo`) is an error that says so. An empty section (`rollout:`) is {}."""
    fields = model.model_fields
    for key, value in raw.items():
        where = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            valid = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key '{where}'{hint} (valid here: {valid})")
        annotation = fields[key].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if value is None:
                raw[key] = value = {}
            if not isinstance(value, dict):
                raise ConfigError(not_a_section(where, annotation, value))
            check_keys(value, annotation, prefix=f"{where}.")
        item = list_item_model(annotation)
        if item is not None and isinstance(value, list):
            for i, entry in enumerate(value):
                if isinstance(entry, dict):
                    check_keys(entry, item, prefix=f"{where}.{i}.")


def not_a_section(where: str, section: type[BaseModel], value: Any) -> str:
    keys = list(section.model_fields)
    text = f"'{where}' is a section (keys: {', '.join(keys)}), not a value; got {value!r}"
    if "name" in keys and isinstance(value, str | int | float | bool):
        text += f"; did you mean '{where}.name={value}'?"
    return text


def list_item_model(annotation: Any) -> type[BaseModel] | None:
    """`Model` for a `list[Model]` annotation, else None."""
    if typing.get_origin(annotation) is not list:
        return None
    (arg,) = typing.get_args(annotation) or (None,)
    return arg if isinstance(arg, type) and issubclass(arg, BaseModel) else None


def list_hint(loc: tuple[Any, ...], name: str) -> str:
    """The list form of a single value given where a list is expected: `[{name: gar}]` for a
    list of parts (reward.shapers), `[jsonl]` for a list of values (train.loggers)."""
    annotation: Any = Config
    for part in loc:
        if isinstance(part, int):
            annotation = (typing.get_args(annotation) or (None,))[0]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = (
                annotation.model_fields[part].annotation
                if part in annotation.model_fields
                else None
            )
        else:
            return ""
    item = list_item_model(annotation)
    if item is not None or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return f"; did you mean [{{name: {name}}}]?"
    return f"; did you mean [{name}]?" if typing.get_origin(annotation) is list else ""


def describe_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        cause = e.get("ctx", {}).get("error")
        if isinstance(cause, ConfigError):  # raised by a validator: already worded
            return str(cause)
        where = ".".join(str(p) for p in e["loc"]) or "config"
        hint = ""
        if e["type"] == "literal_error" and isinstance(e.get("input"), str):
            # "Input should be 'a', 'b' or 'c'": name the nearest of the valid values.
            valid = re.findall(r"'([^']*)'", e["msg"])
            close = difflib.get_close_matches(e["input"], valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
        if e["type"] in ("model_type", "list_type") and isinstance(e.get("input"), str):
            hint = list_hint(e["loc"], e["input"])
        lines.append(f"{where}: {e['msg']} (got {e.get('input')!r}){hint}")
    return "invalid config:\n  " + "\n  ".join(lines)


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
