"""A full disk during a checkpoint save, for tests/train/test_dist_checkpoint.py; run under
torchrun with 2 processes it is that test's worker: a 2-step FSDP2 `policyopt train` RUN
whose step-2 checkpoint finds the disk full on rank 1 only (its DCP shard write); each
rank writes its exit code and stderr to RUN/../rankR.txt.

    torchrun --nproc-per-node 2 full_disk_worker.py RUN
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from policyopt.cli.main import main
from policyopt.store import checkpoint as ckpt
from run_configs import small_overrides

FAILURES = {
    "ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
    # torch's own writer reports a full disk so (checkpoint.out_of_space asks the disk)
    "torch-writer": lambda: RuntimeError("basic_ios::clear"),
}


def full_disk_save(run: Path, where: str, failure: str) -> Callable[..., Any]:
    """A `torch.save` that fails as a full disk once `run` has a complete checkpoint, when it
    writes into `run`'s checkpoints: into DCP's shard files (`where="shards"`: a file stream,
    which DCP's writer wraps as `.raw`) or rank 0's own files (`"rank0"`: trainer_state.pt,
    saved by path). Elsewhere (torch.distributed pickling tensors into memory) it saves."""
    real_save = torch.save
    root = str(ckpt.checkpoint_root(run))

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        by_path = isinstance(f, (str, os.PathLike))
        target = str(f) if by_path else str(getattr(getattr(f, "raw", f), "name", ""))
        if target.startswith(root) and by_path == (where == "rank0") and ckpt.list_checkpoints(run):
            raise FAILURES[failure]()
        return real_save(obj, f, *args, **kwargs)

    return save


def fsdp2_argv(run: Path) -> list[str]:
    """2 steps, a checkpoint after each, FSDP2."""
    return [
        "train",
        *small_overrides(run, steps=2),
        "train.save_every=1",
        "train.parallel=fsdp2",
        "eval.size=0",
    ]


def worker(run: Path) -> None:
    rank = int(os.environ["RANK"])
    if rank == 1:
        torch.save = full_disk_save(run, "shards", "ENOSPC")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(fsdp2_argv(run))
    (run.parent / f"rank{rank}.txt").write_text(f"{code}\n{err.getvalue()}")
    sys.exit(code)


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
