"""Checkpoints: safetensors weights plus everything needed to continue exactly.

A checkpoint is a folder `checkpoints/step-XXXXXXXX/` holding the model in Hugging Face
format (safetensors; the adapter only for a LoRA model, optionally merged weights too) and
`trainer_state.pt` (optimizer, scheduler, RNG states, data position, step, shaper states).
It is written under a temporary name and renamed into place, so a run killed while saving
leaves the previous checkpoints intact and no half-written one that looks complete.
"""

from __future__ import annotations

import copy
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

PREFIX = "step-"
STATE_FILE = "trainer_state.pt"


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    state: dict[str, Any],
    *,
    keep_last: int = 2,
    save_merged: bool = False,
) -> Path:
    """Write checkpoint `step` atomically and delete all but the newest `keep_last`."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{PREFIX}{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if save_merged and hasattr(model, "merge_and_unload"):
        # Merge a copy: merging in place would end LoRA training.
        merged = copy.deepcopy(model).merge_and_unload()
        merged.save_pretrained(tmp / "merged", safe_serialization=True)
    torch.save(state, tmp / STATE_FILE)
    _fsync_tree(tmp)
    if final.exists():  # re-saving the same step (e.g. final save after a periodic one)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(output_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders are never listed)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def remove_stale_temporaries(output_dir: str | Path) -> None:
    """Folders a killed save left behind."""
    root = checkpoint_root(output_dir)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)


def load_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load a checkpoint's weights into `model` in place (a plain or a PEFT model)."""
    adapter = checkpoint / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(adapter))
        if getattr(result, "unexpected_keys", None):
            raise RuntimeError(f"{adapter}: unexpected adapter keys {result.unexpected_keys[:5]}")
        return
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in checkpoint {checkpoint}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(f))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if _is_tied(model, k)}
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"checkpoint {checkpoint} does not match the model: missing "
            f"{sorted(set(missing) - tied)[:5]}, unexpected {unexpected[:5]}"
        )


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
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
