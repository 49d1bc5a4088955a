"""A run folder: recognisable as one, owned by one live run at a time.

Every command that writes into a folder the user names (`train`, `quickstart` and the
runs of `compare` through the trainer, `sft`, `compare`'s own report) claims it first with
`claim`, the one place this is decided:

- a folder that does not exist, or is empty, becomes a run folder: the marker file
  `.policyopt-run` is written in it;
- a folder with the marker is a run folder (a rerun resumes or replaces what it wrote);
- a folder without the marker that holds a file a run writes (`RUN_FILES`: `config.yaml`,
  `samples.jsonl`, `model.safetensors`, ...) is the user's: refused, nothing written, since
  writing there would overwrite their files. Other files (data, a reward module) may be
  there: a run writes beside them. A run folder of an older policyopt (before the marker)
  is recognised by its complete checkpoints and adopted;
- a path that is a file is refused;
- the marker is locked (`fcntl.flock`, exclusive) for as long as the run holds it: a second
  process claiming a live folder fails at once, naming it. The kernel drops the lock when the
  process ends however it ends (a crash, SIGKILL), so a dead run never blocks its rerun.

Within one process a folder is claimed again freely (claims are counted): the lock keeps a
second *process* out, and tests and the in-process study runner start runs one after another
without necessarily closing the earlier trainer object.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MARKER = ".policyopt-run"
FORMAT = 1

# Top-level names a policyopt command writes into its output folder: the trainer and its
# loggers, the quickstart pipeline, `sft` (a model folder in Hugging Face format) and
# `compare`. tests/store/test_run_folder.py checks that a run writes nothing else.
RUN_FILES = frozenset(
    {
        # trainer, loggers, plots
        "config.yaml",
        "config.yaml.tmp",
        "metrics.jsonl",
        "samples.jsonl",
        "checkpoints",
        "tensorboard",
        "wandb",
        "mlruns",
        "curves.png",
        # quickstart, and the dmrl pipeline's long-term reward predictor
        "initial_eval.json",
        "summary.json",
        "lrp",
        # sft: what save_pretrained writes, and the SFT metrics
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "sft_metrics.json",
        # compare and its study report
        "compare.json",
        "compare.md",
        "compare.png",
        "report.md",
    }
)


class RunFolderError(ValueError):
    """An output folder that a run may not write into (the user's files, a file, a live run)."""


@dataclass
class _Held:
    handle: IO[str]
    claims: int
    created: bool  # the folder did not exist before the first claim


_HELD: dict[Path, _Held] = {}  # this process's locked folders (resolved path -> lock)


def claim(folder: str | Path, what: str = "train.output_dir") -> Path:
    """Make `folder` this process's run folder (see the module docstring) and return it;
    `what` names the setting in messages. Raises RunFolderError, writing nothing, where the
    folder is a file, holds the user's files, or is held by another live process."""
    path = Path(folder).expanduser()
    key = path.resolve()
    held = _HELD.get(key)
    if held is not None:
        held.claims += 1
        return path
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{what} {path} is a file, not a folder; choose a folder path")
    marker = path / MARKER
    if path.is_dir() and not marker.exists():
        foreign = sorted(p.name for p in path.iterdir() if p.name in RUN_FILES)
        if foreign and not _older_run(path):
            raise RunFolderError(
                f"{what} {path} is not a policyopt run folder (no {MARKER}) and holds "
                f"{', '.join(foreign)}, which a run would overwrite; choose another folder"
            )
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file on the way (a/b with a a file)
        raise RunFolderError(f"{what} {path}: a part of the path is a file, not a folder") from None
    handle = open(marker, "a+")  # noqa: SIM115 - held open: the lock lives with it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RunFolderError(
            f"{what} {path} is in use by another running policyopt process; wait for it to "
            "finish or stop it, or choose another folder"
        ) from None
    handle.seek(0)
    if not handle.read().strip():
        handle.write(json.dumps({"format": FORMAT, "created": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
        os.fsync(handle.fileno())
    _HELD[key] = _Held(handle, 1, created)
    return path


def release(folder: str | Path, *, abandon: bool = False) -> None:
    """Give back one claim of `folder`; the last one unlocks it (the marker stays). With
    `abandon` (a run that failed to start), a folder the first claim created is removed
    with what the run wrote into it: nothing of the user's can be in it."""
    key = Path(folder).expanduser().resolve()
    held = _HELD.get(key)
    if held is None:
        return
    held.claims -= 1
    if held.claims > 0:
        return
    del _HELD[key]
    held.handle.close()  # closing the descriptor drops the flock
    if abandon and held.created and all(p.name in RUN_FILES | {MARKER} for p in key.iterdir()):
        shutil.rmtree(key, ignore_errors=True)


def is_run_folder(folder: str | Path) -> bool:
    return (Path(folder) / MARKER).is_file()


def _older_run(path: Path) -> bool:
    """A run folder written before the marker existed: it has a complete checkpoint."""
    from policyopt.store.checkpoint import list_checkpoints  # torch: only for this case

    return bool(list_checkpoints(path))
