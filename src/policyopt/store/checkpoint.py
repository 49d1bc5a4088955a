"""Checkpoints: safetensors weights plus everything needed to continue exactly.

A checkpoint is a folder `checkpoints/step-XXXXXXXX/` holding the model in Hugging Face
format (safetensors; the adapter only for a LoRA model, optionally merged weights too),
`trainer_state.pt` (optimizer, scheduler, RNG states, data position, step, shaper states;
tensors and plain data only, loaded with `weights_only=True`), the run's config
(`run_config.yaml`, signed as this user's: `run_config.yaml.sig`), the hashes of its data files (`data_fingerprint.json`, compared on
resume by `policyopt.config.resume_check`), and last of all the completion marker `COMPLETE`.

A checkpoint is complete only if its marker is there and every file the marker lists has
the size it records; everything else (a folder a killed save or an older policyopt left, a
file truncated by a full disk) is incomplete: never resumed from, reported, never pruned
(it may be someone's only copy); only a complete save of the same step replaces it.

`finish_checkpoint` is the one place a checkpoint becomes complete: contents written into
the temporary folder `begin_checkpoint` made are synced, marked, then renamed into place; a
step saved again replaces the old folder only after the new one is complete, and `recover`
puts the old one back if a kill came between the two renames. `commit_checkpoint` wraps the
two around a `write(folder)` callback, for a single process.

A save that fails for want of space (ENOSPC or a quota, however the writer reports it) is
a `DiskFullError` naming the folder and the last complete checkpoint, after the partial
folder is removed; the complete checkpoints are untouched (`abandon_checkpoint`, which the
sharded save of train/dist_checkpoint.py shares).
"""

from __future__ import annotations

import copy
import errno
import json
import os
import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from policyopt.store import provenance

PREFIX = "step-"
STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "run_config.yaml"
MARKER = "COMPLETE"
DATA_FILE = "data_fingerprint.json"
DATA_KEY = "data_fingerprint"  # the trainer state's entry written to DATA_FILE
FORMAT = 1
TEMP = ".tmp-"  # a save in progress, or a pruned checkpoint being deleted
REPLACED = ".replaced-"  # the previous copy of a step being saved again


class UnsafeCheckpointError(ValueError):
    """A state file holds objects other than tensors and plain data: loading it could run code."""


class DiskFullError(OSError):
    """No space left to write a checkpoint; the message names the folder and the last
    complete checkpoint."""


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def step_of(checkpoint: Path) -> int:
    return int(checkpoint.name[len(PREFIX) :])


# ----------------------------------------------------------------- RNG state
def rng_state() -> dict[str, Any]:
    """Every RNG a step draws from, as tensors and plain data (safe to load)."""
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "name": str(name),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    key = n["key"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], key, n["pos"], n["has_gauss"], n["gauss"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------- state file
def save_state(folder: Path, state: dict[str, Any]) -> None:
    """`trainer_state.pt`, and the data fingerprint (if the state has one) as readable JSON
    beside it, where a resume reads it without loading the state."""
    state = dict(state)
    data = state.pop(DATA_KEY, None)
    if data is not None:
        (folder / DATA_FILE).write_text(json.dumps(data, indent=1, sort_keys=True))
    torch.save(state, folder / STATE_FILE)


def read_data_fingerprint(checkpoint: Path) -> dict[str, Any] | None:
    """The data fingerprint a checkpoint was saved with; None for one without."""
    path = checkpoint / DATA_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state, unpickled with `weights_only=True`: a state file that would run
    code (or build any object besides tensors and plain containers) is refused."""
    path = checkpoint / STATE_FILE
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds objects other than tensors and plain data, "
            f"and unpickling them could run code ({first}). Only load checkpoints you made "
            "with this version of policyopt or trust completely."
        ) from None


# ----------------------------------------------------------------- saving
def save_checkpoint(
    output_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    state: dict[str, Any],
    *,
    config_text: str | None = None,
    keep_last: int = 2,
    save_merged: bool = False,
) -> Path:
    """Write checkpoint `step` (complete or not at all) and prune to the newest `keep_last`."""

    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        if save_merged and hasattr(model, "merge_and_unload"):
            # Merge a copy: merging in place would end LoRA training.
            merged = copy.deepcopy(model).merge_and_unload()
            merged.save_pretrained(folder / "merged", safe_serialization=True)
            if tokenizer is not None:  # a whole model: loadable on its own (`eval --model`)
                tokenizer.save_pretrained(folder / "merged")
        if config_text is not None:
            (folder / CONFIG_FILE).write_text(config_text)
        save_state(folder, state)

    return commit_checkpoint(output_dir, step, write, keep_last=keep_last)


def commit_checkpoint(
    output_dir: str | Path, step: int, write: Callable[[Path], None], *, keep_last: int
) -> Path:
    """`write(folder)` fills a temporary folder; it becomes `step-XXXXXXXX` complete or not at all."""
    tmp = begin_checkpoint(output_dir, step)
    try:
        write(tmp)
        return finish_checkpoint(output_dir, step, keep_last=keep_last)
    except BaseException as err:
        failure = abandon_checkpoint(output_dir, step, err)
        if failure is err:
            raise
        raise failure from err


def abandon_checkpoint(output_dir: str | Path, step: int, err: BaseException) -> BaseException:
    """After the save of `step` failed with `err`: remove its temporary folder and return
    what to raise, a `DiskFullError` (`disk_full`) if the write ran out of space, else `err`.
    The complete checkpoints are not touched."""
    tmp = _temporary(output_dir, step)
    full = out_of_space(err, tmp)  # asked before the space is given back
    shutil.rmtree(tmp, ignore_errors=True)  # e.g. a full disk: give the space back now
    return disk_full(output_dir, step) if full else err


def out_of_space(err: BaseException, folder: Path) -> bool:
    """Whether a failed write ran out of space: ENOSPC/EDQUOT, or a writer's own error (torch's
    "basic_ios::clear", "file write failed") while the file system has (almost) no room."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    if not isinstance(err, RuntimeError):
        return False
    try:
        return free_space(folder if folder.exists() else folder.parent) < 1 << 20
    except OSError:
        return False


def free_space(path: Path) -> int:
    """Bytes free on the file system of `path`."""
    return shutil.disk_usage(path).free


def disk_full(output_dir: str | Path, step: int) -> DiskFullError:
    latest = latest_checkpoint(output_dir)
    last = (
        f"the last complete checkpoint is step {step_of(latest)} ({latest})"
        if latest is not None
        else "no checkpoint of this run is complete"
    )
    error = DiskFullError(
        f"no space left on {checkpoint_root(output_dir)} to save step {step}; {last}. Free "
        "space (or lower train.keep_last) and run the same command again"
    )
    error.errno = errno.ENOSPC  # set after: given to the constructor it would prefix "[Errno 28]"
    return error


def begin_checkpoint(output_dir: str | Path, step: int) -> Path:
    """An empty temporary folder for checkpoint `step`. Its name depends on the step only, so
    every process of a sharded save can write its part there before one calls finish."""
    tmp = _temporary(output_dir, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def finish_checkpoint(output_dir: str | Path, step: int, *, keep_last: int) -> Path:
    """Make the written temporary folder checkpoint `step`: fsync its contents, write the
    marker (last), rename it into place (an older copy of the step is set aside first and
    deleted after), then prune to the newest `keep_last` complete checkpoints."""
    tmp = _temporary(output_dir, step)
    final = checkpoint_root(output_dir) / f"{PREFIX}{step:08d}"
    if (tmp / CONFIG_FILE).is_file():
        # Written by this user's policyopt: `eval` obeys the code it names (store/provenance.py).
        provenance.sign(tmp / CONFIG_FILE)
    _fsync_tree(tmp)
    mark_complete(tmp, step)
    _publish(tmp, final)
    _prune(list_checkpoints(output_dir)[:-keep_last])
    return final


def _temporary(output_dir: str | Path, step: int) -> Path:
    return checkpoint_root(output_dir) / f"{TEMP}{PREFIX}{step:08d}"


def mark_complete(folder: Path, step: int) -> None:
    """Write the marker, last: the step and the size of every file already in `folder`."""
    files = {
        str(f.relative_to(folder)): f.stat().st_size
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.name != MARKER
    }
    record = {"format": FORMAT, "step": step, "files": files}
    partial = folder / f"{MARKER}.partial"
    with open(partial, "w") as fh:
        fh.write(json.dumps(record, indent=1))
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(partial, folder / MARKER)
    _fsync_dir(folder)


def _publish(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; an existing `final` is set aside first, deleted only after."""
    aside = final.with_name(f"{REPLACED}{final.name}")
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        _fsync_dir(final.parent)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def _prune(old: list[Path]) -> None:
    for path in old:
        # Renamed first so a kill mid-delete never leaves a half-deleted "step-" folder.
        doomed = path.with_name(f"{TEMP}deleting-{path.name}")
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


# ----------------------------------------------------------------- finding checkpoints
def is_complete(folder: Path) -> bool:
    """The marker is there, parses, and every file it lists has the recorded size."""
    try:
        record = json.loads((folder / MARKER).read_text())
        files = record["files"]
        return record.get("format") == FORMAT and all(
            (folder / name).stat().st_size == size for name, size in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _step_folders(output_dir: str | Path) -> list[Path]:
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()
    ]
    return sorted(found, key=step_of)


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    return [p for p in _step_folders(output_dir) if is_complete(p)]


def incomplete_checkpoints(output_dir: str | Path) -> list[Path]:
    """`step-` folders without a valid completion marker (ignored by resume)."""
    return [p for p in _step_folders(output_dir) if not is_complete(p)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def recover(output_dir: str | Path) -> list[str]:
    """Repair what a killed save left, before resuming; returns what it did, for the log.

    A step set aside by `_publish` goes back if its replacement is not complete; temporary
    folders (unfinished saves, unfinished deletes) are removed.
    """
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    notes = []
    for aside in sorted(root.glob(f"{REPLACED}{PREFIX}*")):
        final = root / aside.name[len(REPLACED) :]
        if is_complete(final) or not is_complete(aside):
            shutil.rmtree(aside, ignore_errors=True)
            continue
        if final.exists():
            shutil.rmtree(final)
        os.rename(aside, final)
        notes.append(f"restored {final.name} (a save of the same step was interrupted)")
    for tmp in root.glob(f"{TEMP}*"):
        shutil.rmtree(tmp, ignore_errors=True)
    return notes


# ----------------------------------------------------------------- weights
def load_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load a checkpoint's weights into `model` in place (a plain or a PEFT model).

    Weights of another model (a resume with `train.resume_anyway=true` after changing
    `model.name_or_path`) are a ValueError, which a command prints as one line: it names the
    checkpoint, the first tensor whose shape differs with both shapes (else the tensors only
    one side has) and what to do. A plain model is checked before anything is copied into
    it."""
    other = "resume with the model that trained it, or start a new train.output_dir"
    adapter = checkpoint / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        try:
            result = set_peft_model_state_dict(model, load_file(adapter))
        except RuntimeError as error:  # torch's size mismatch, one line per tensor
            lines = [
                ln.strip().rstrip(".") for ln in str(error).splitlines() if "size mismatch" in ln
            ]
            if not lines:
                raise
            raise ValueError(
                f"checkpoint {checkpoint} holds weights of another model: {lines[0]}; {other}"
            ) from None
        if getattr(result, "unexpected_keys", None):
            raise ValueError(
                f"checkpoint {checkpoint} holds weights of another model: unexpected adapter "
                f"keys {result.unexpected_keys[:5]}; {other}"
            )
        return
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in checkpoint {checkpoint}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(f))
    own = model.state_dict()
    for key, tensor in own.items():  # in the model's order: the first layer first
        if key in weights and weights[key].shape != tensor.shape:
            raise ValueError(
                f"checkpoint {checkpoint} holds weights of another model: {key} is "
                f"{tuple(weights[key].shape)} there and {tuple(tensor.shape)} in this model; "
                f"{other}"
            )
    missing = [k for k in own if k not in weights and not _is_tied(model, k)]
    unexpected = [k for k in weights if k not in own]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {checkpoint} holds weights of another model: it lacks "
            f"{missing[:5]}{' ...' if len(missing) > 5 else ''} and has "
            f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}, which this model "
            f"does not; {other}"
        )
    model.load_state_dict(weights, strict=False)


def _is_tied(model: torch.nn.Module, key: str) -> bool:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return (
        out is not None
        and inp is not None
        and out.weight is inp.weight
        and key.endswith("weight")
        and ("lm_head" in key or "embed" in key)
    )


def _fsync_tree(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        elif f.is_dir():
            _fsync_dir(f)
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
