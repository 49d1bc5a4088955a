"""The one config-time check of a run's parts: `check_config(config)`.

Names and options of every registered part, declared structure, the loss's own settings and
the task function, all before any model is loaded. It reads the config and never changes it:
what the loss's own defaults make of `algorithm.agg` / `clip_low` / `clip_high` is computed
where the loss is bound (`loss_settings`). `load_config` checks what it loads; `ensure_checked`
lets an assembly step skip a config that was checked and has not changed since.
"""

from __future__ import annotations

import inspect
from typing import Any

from policyopt.config.check_parts import check_parts
from policyopt.config.schema import Config, ConfigError
from policyopt.config.structure_check import check_config_structure
from policyopt.core.structure import MissingStructureError

LOSS_SETTINGS = ("agg", "clip_low", "clip_high")


class ConfigStructureError(ConfigError, MissingStructureError):
    """A configured part needs structure that no part of the config produces."""


def check_config(config: Config) -> None:
    """Every registered name and option of `config`, its declared structure, its loss's
    settings and its task function. Raises `ConfigError`; changes nothing."""
    problems = check_parts(config)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    try:
        check_config_structure(config)
    except KeyError as err:  # an unknown registered name
        raise ConfigError(str(err.args[0])) from None
    except MissingStructureError as err:  # a required input without a producer
        raise ConfigStructureError(str(err)) from None
    except ValueError as err:  # a reward function that cannot load
        raise ConfigError(str(err)) from None
    loss_settings(config)
    names = [f.name for f in config.reward.functions]
    chosen = config.reward.task_function
    if chosen is not None and chosen not in names:
        raise ConfigError(
            f"reward.task_function: {chosen!r} is not one of reward.functions ({', '.join(names)})"
        )
    config._checked = _fingerprint(config)


def ensure_checked(config: Config) -> None:
    """`check_config` unless this very config was checked and has not changed since (a config
    from `load_config` handed on unchanged is checked once)."""
    if config._checked != _fingerprint(config):
        check_config(config)


def loss_settings(config: Config) -> dict[str, Any]:
    """`algorithm.agg` / `clip_low` / `clip_high` as the loss will use them: each left None
    takes the loss's own keyword default (where every paper default lives); one the loss does
    not take is an error."""
    from policyopt.core import POLICY_LOSSES

    alg = config.algorithm
    params = inspect.signature(POLICY_LOSSES.get(alg.loss)).parameters
    out: dict[str, Any] = {}
    for key in LOSS_SETTINGS:
        value = getattr(alg, key)
        if key not in params:
            if value is not None:
                raise ConfigError(
                    f"algorithm.{key}: the {alg.loss!r} loss does not use {key} (it has its "
                    f"own normalisation or clip); remove algorithm.{key}"
                )
        else:
            out[key] = params[key].default if value is None else value
    return out


def _fingerprint(config: Config) -> str:
    return config.model_dump_json()
