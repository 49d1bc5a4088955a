"""Whether a run may continue a checkpoint trained with another config.

`train.resume: auto` picks up whatever run is in `train.output_dir`: a changed learning rate,
method or reward there would silently splice two experiments into one curve. So a resume
compares the new config with the one that trained the checkpoint (`run_config.yaml` in the
checkpoint) and stops, naming every differing key, unless `train.resume_anyway=true`.

The data is compared the same way: `data_fingerprint` hashes (sha256) every file or folder
a task option names, a checkpoint keeps those hashes (`data_fingerprint.json`), and
`check_resume_data` stops a resume whose data file changed since, even at the same path and
modification time, unless `train.resume_anyway=true`.

Keys that change how long, where, how fast or how verbosely a run goes, but not what it
trains, may differ (RESUME_SAFE_KEYS). `train.steps` and `train.max_generated_tokens` extend
or shorten the run (`steps` also sets the lr schedule's length). The resource knobs
(threads, micro-batch size, generation batch size, logit chunk size, vLLM memory settings,
reward prefetch, the data-parallel mode) leave the result mathematically the same, though
not bit-identical where float sums regroup (a different number of ranks also samples with
other RNG streams).
"""

from __future__ import annotations

import hashlib
import json
import os
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


def data_fingerprint(config: Config) -> dict[str, dict[str, str]]:
    """{option key: {"path": ..., "sha256": ...}} for every task option (at any depth, in
    lists too) that names an existing local file or folder: the data the run reads, by
    content. Hub names and in-memory tasks have none."""
    return {
        key: {"path": path, "sha256": content_hash(Path(path))}
        for key, path in data_files(config).items()
    }


def data_files(config: Config) -> dict[str, str]:
    """{option key: path} for every task option (at any depth, in lists too) that names an
    existing local file or folder: what `data_fingerprint` hashes."""
    return {
        key: value
        for key, value in _leaves(config.task.options, "task.options")
        if isinstance(value, str) and value and os.path.exists(value)
    }


def _leaves(value: Any, key: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{key}.{k}")]
    if isinstance(value, list | tuple):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{key}.{i}")]
    return [(key, value)]


def content_hash(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative names and bytes, sorted)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if f is not path:
            digest.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def check_resume_data(
    checkpoint: Path, fingerprint: dict[str, dict[str, str]], config: Config
) -> list[str]:
    """Raise ConfigMismatchError if a data file the checkpoint was trained on has other
    contents now (unless train.resume_anyway); returns the keys of the changed files. A
    checkpoint without a fingerprint (an older policyopt) is not checked."""
    from policyopt.store.checkpoint import read_data_fingerprint

    saved = read_data_fingerprint(checkpoint)
    if saved is None:
        return []
    changed = []
    for key, then in saved.items():
        now = fingerprint.get(key)
        if now is None or now["path"] != then.get("path"):
            continue  # a changed option is the config check's to name
        if now["sha256"] != then.get("sha256"):
            changed.append(key)
            if not config.train.resume_anyway:
                raise ConfigMismatchError(
                    f"train.resume: the data file {now['path']} ({key}) has changed since it "
                    f"trained {checkpoint} (sha256 {str(then.get('sha256'))[:12]} then, "
                    f"{now['sha256'][:12]} now); restore it, resume anyway with "
                    "train.resume_anyway=true, or choose another train.output_dir"
                )
    return changed
