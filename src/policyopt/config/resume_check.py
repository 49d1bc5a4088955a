"""Whether a run may continue a checkpoint trained with another config.

`train.resume: auto` picks up whatever run is in `train.output_dir`: a changed learning rate,
method or reward there would silently splice two experiments into one curve. So a resume
compares the new config with the one that trained the checkpoint (`run_config.yaml` in the
checkpoint) and stops, naming every differing key, unless `train.resume_anyway=true`.

Keys that change how long, where, how fast or how verbosely a run goes, but not what it
trains, may differ (RESUME_SAFE_KEYS). `train.steps` and `train.max_generated_tokens` extend
or shorten the run (`steps` also sets the lr schedule's length). The resource knobs
(threads, micro-batch size, generation batch size, logit chunk size, vLLM memory settings,
reward prefetch, the data-parallel mode) leave the result mathematically the same, though
not bit-identical where float sums regroup (a different number of ranks also samples with
other RNG streams).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policyopt.config.load import Config, ConfigError

RESUME_SAFE_KEYS = frozenset(
    {
        "train.steps",
        "train.max_generated_tokens",
        "train.output_dir",
        "train.resume",
        "train.resume_anyway",
        "train.progress",
        "train.num_threads",
        "train.loggers",
        "train.log_every",
        "train.log_samples",
        "train.plot",
        "train.save_every",
        "train.keep_last",
        "train.micro_batch_size",
        "train.parallel",
        "model.logit_chunk_size",
        "rollout.batch_size",
        "rollout.engine_options.gpu_memory_utilization",
        "rollout.engine_options.kv_cache_memory_bytes",
        "rollout.engine_options.enforce_eager",
        "reward.prefetch",
    }
)


ABSENT = object()  # a key one config has and the other has not (an options dict)


class ConfigMismatchError(ConfigError):
    """Resuming a checkpoint trained with a different config, without train.resume_anyway."""


def changed_keys(saved: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(dotted key, saved value, new value) for each key that differs and matters."""
    old, now = _flatten(saved.model_dump(mode="json")), _flatten(new.model_dump(mode="json"))
    return [
        (key, old.get(key, ABSENT), now.get(key, ABSENT))
        for key in sorted(old.keys() | now.keys())
        if key not in RESUME_SAFE_KEYS and old.get(key, ABSENT) != now.get(key, ABSENT)
    ]


def check_resume_config(saved_file: Path, checkpoint: Path, config: Config) -> list[str]:
    """Raise ConfigMismatchError if `config` differs from the saved one in a key that matters
    (unless train.resume_anyway); returns the differing keys (empty when they match)."""
    if not saved_file.exists():
        return []
    try:
        saved = Config.model_validate(yaml.safe_load(saved_file.read_text()) or {})
    except (ValidationError, yaml.YAMLError, KeyError) as err:
        if config.train.resume_anyway:
            return ["<unreadable saved config>"]
        raise ConfigMismatchError(
            f"train.resume: the config that trained {checkpoint} ({saved_file}) does not load "
            f"with this version of policyopt ({str(err).splitlines()[0]}); resume anyway with "
            "train.resume_anyway=true, or choose another train.output_dir"
        ) from None
    changed = changed_keys(saved, config)
    if changed and not config.train.resume_anyway:
        lines = "\n  ".join(f"{k} (saved {_show(a)}, now {_show(b)})" for k, a, b in changed)
        raise ConfigMismatchError(
            f"train.resume: the config differs from the one that trained {checkpoint}:\n  "
            f"{lines}\nResume anyway with train.resume_anyway=true (the new values apply from "
            "the next step), or choose another train.output_dir for a new run."
        )
    return [k for k, _, _ in changed]


def _show(value: Any) -> str:
    return "(absent)" if value is ABSENT else json.dumps(value)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
