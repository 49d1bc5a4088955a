"""Checkpoints of a data-parallel run, readable by any number of ranks.

- none / ddp: the single-process checkpoint (trainer.checkpoint), written by rank 0; every
  rank holds the whole model and optimizer state, so any world size reads it back.
- fsdp2: each rank writes its shards of the model and optimizer state with
  torch.distributed.checkpoint (folder `dcp/`, keyed by parameter names, so a run with a
  different number of ranks, or one process, reshards on load), and rank 0 adds the
  consolidated weights in Hugging Face format (for eval and export), the tokenizer, the
  run config and `trainer_state.pt` (no optimizer in it). All of it goes into the
  checkpoint's temporary folder, and rank 0 alone completes it (marker written last, then
  the rename: trainer.checkpoint), after every rank's shards are written.

A save that fails is settled by rank 0, which tells every rank how it ended (so that none
trains on, or waits in a collective, after another stopped): the partial folder is removed
(`checkpoint.abandon_checkpoint`, as in one process) and a full disk, on any rank's write, is
the same `DiskFullError` on every rank, naming the last complete checkpoint.

The trainer state carries every rank's RNG state (`rng_ranks`); a resumed rank takes its
own when the world size is unchanged, else a fresh seed of its rank and the step.
"""

from __future__ import annotations

import errno
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from policyopt.store import checkpoint as ckpt
from policyopt.train.distributed import Dist

SHARDS = "dcp"


def save(
    dist: Dist,
    output_dir: str | Path,
    step: int,
    *,
    model: nn.Module,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokenizer: Any,
    state: dict[str, Any],
    config_text: str,
    keep_last: int,
    save_merged: bool,
) -> Path:
    """Write checkpoint `step`; collective (every rank calls it). `model` is the Hugging Face
    model, `policy` its `PolicyForward` (unwrapped from DDP), `state` the trainer state
    without optimizer and RNG (added here)."""
    state = {**state, "rng": ckpt.rng_state(), "rng_ranks": dist.gather(ckpt.rng_state())}
    failure: BaseException | None = None
    path = None
    try:
        if dist.mode == "fsdp2":
            _save_sharded(
                dist, output_dir, step, model, policy, optimizer, tokenizer, state, config_text
            )
            if dist.is_main:
                path = ckpt.finish_checkpoint(output_dir, step, keep_last=keep_last)
        elif dist.is_main:
            path = ckpt.save_checkpoint(
                output_dir,
                step,
                model,
                tokenizer,
                {**state, "optimizer": optimizer.state_dict()},
                config_text=config_text,
                keep_last=keep_last,
                save_merged=save_merged,
            )
    except BaseException as err:
        failure = err
    # Rank 0 says how the save ended and every rank acts on it, so that no rank goes on
    # training, or waits in a collective, after another has stopped.
    outcome = None
    if dist.is_main:
        outcome = ("saved", str(path))
        if failure is not None:
            # The partial folder goes; a full disk (on any rank's write) becomes the same one
            # line as in one process (checkpoint.disk_full).
            raised = ckpt.abandon_checkpoint(output_dir, step, _writer_error(failure))
            full = isinstance(raised, ckpt.DiskFullError)
            outcome = ("disk full" if full else "failed", None)
    outcome = dist.broadcast(outcome)
    if outcome[0] == "disk full":
        if isinstance(failure, ckpt.DiskFullError):  # the single-process save's own
            raise failure
        raise ckpt.disk_full(output_dir, step) from failure
    if failure is not None:
        raise failure
    if outcome[0] == "failed":
        raise RuntimeError(f"checkpoint step {step} was not saved: rank 0's write failed")
    return Path(outcome[1])


def _save_sharded(
    dist: Dist,
    output_dir: str | Path,
    step: int,
    model: nn.Module,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokenizer: Any,
    state: dict[str, Any],
    config_text: str,
) -> None:
    """FSDP2: every rank's shards, then rank 0's consolidated weights, tokenizer, config and
    trainer state, into the step's temporary folder; collective. Rank 0 completes it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )

    # The temporary folder's name depends on the step only: every rank writes its shards
    # there, then rank 0 adds the rest and makes it complete (checkpoint.finish_checkpoint).
    folder = Path(
        dist.broadcast(str(ckpt.begin_checkpoint(output_dir, step)) if dist.is_main else None)
    )
    model_sd, optim_sd = get_state_dict(policy, optimizer)
    # A write that fails on one rank fails dcp.save on every rank (it gathers the results).
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder / SHARDS))
    # Consolidated weights on rank 0 (an all-gather of each parameter, one at a time).
    full = get_model_state_dict(
        policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.is_main:
        weights = {k.removeprefix("policy."): v for k, v in full.items()}
        model.save_pretrained(folder, safe_serialization=True, state_dict=weights)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        (folder / ckpt.CONFIG_FILE).write_text(config_text)
        ckpt.save_state(folder, state)


def _writer_error(err: BaseException) -> BaseException:
    """The write error inside DCP's `CheckpointException` (which holds each failed rank's
    error), a full disk first; any other error as it is."""
    from torch.distributed.checkpoint.api import CheckpointException

    if not isinstance(err, CheckpointException):
        return err
    errors = [inner for inner, _ in err.failures.values()]
    full = [e for e in errors if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)]
    return (full or errors or [err])[0]


def load(
    dist: Dist,
    path: Path,
    *,
    model: nn.Module,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    seed: int,
) -> dict[str, Any]:
    """Load weights and optimizer state of checkpoint `path` into this rank's (possibly
    sharded) model and optimizer; set this rank's RNG; return the trainer state."""
    state = ckpt.load_state(path)  # refused before anything is touched if unsafe
    if (path / SHARDS).is_dir():
        _load_shards(path / SHARDS, policy, optimizer)
    elif dist.mode == "fsdp2":
        _load_full_into_sharded(path, state["optimizer"], model, policy, optimizer)
    else:
        ckpt.load_weights(model, path)
        optimizer.load_state_dict(state["optimizer"])
    ranks = state.get("rng_ranks")
    if ranks and len(ranks) == dist.world:
        ckpt.set_rng_state(ranks[dist.rank])
    elif dist.rank == 0:
        ckpt.set_rng_state(state["rng"])
    else:  # a different world size: a fresh stream per rank, still reproducible
        s = seed * 1_000_003 + dist.rank * 7_919 + state["step"]
        random.seed(s)
        np.random.seed(s % 2**32)
        torch.manual_seed(s)
    return state


def _load_shards(shards: Path, policy: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """DCP load into the current layout (sharded over any world size, or whole)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(policy, optimizer)
    sd = {"model": model_sd, "optim": optim_sd}
    dcp.load(sd, checkpoint_id=str(shards))
    set_state_dict(policy, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def _load_full_into_sharded(
    path: Path,
    optim_state: dict[str, Any],
    model: nn.Module,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> None:
    """A single-process (or DDP) checkpoint into an FSDP2 run: full weights from safetensors,
    the optimizer's id-keyed state renamed to parameter names, each rank keeping its shards."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    weights: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(load_file(f))
    full = {f"policy.{k}": v for k, v in weights.items()}
    # Tied weights are saved once; the model's state dict lists both names.
    for name in policy.state_dict():
        if name not in full and ckpt._is_tied(model, name.removeprefix("policy.")):
            tied = [k for k in full if "embed" in k and k.endswith("weight")]
            if tied:
                full[name] = full[tied[0]]
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    optim = {
        "state": {names[i]: s for i, s in optim_state["state"].items()},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"]]} for g in optim_state["param_groups"]
        ],
    }
    set_state_dict(
        policy,
        optimizer,
        model_state_dict=full,
        optim_state_dict=optim,
        options=StateDictOptions(full_state_dict=True),
    )
