"""The model cache: models this project builds or converts, each built once per entry.

`cache_dir()` is `$POLICYOPT_CACHE` (default `~/.cache/policyopt`). `build_once` writes an
entry in a temporary folder next to it and renames it into place in one step, so an entry
either does not exist or is complete: a killed build leaves only a stray temporary folder,
and of two concurrent builds the second rename fails and its copy is discarded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def cache_dir() -> Path:
    """Where built models are cached: `$POLICYOPT_CACHE`, default `~/.cache/policyopt`."""
    return Path(os.environ.get("POLICYOPT_CACHE", Path.home() / ".cache" / "policyopt"))


def build_once(final: Path, build: Callable[[Path], None], required: Sequence[str]) -> Path:
    """The cache entry `final`, made by `build(folder)` on first use; `required` are the files
    a complete entry holds (checked every time, so a hand-edited entry is named, not used)."""
    if not final.exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; a cache entry should be readable
        try:
            build(tmp)
            os.rename(tmp, final)  # atomic on POSIX; fails if another build already landed
        except OSError:
            if not final.exists():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    missing = [name for name in required if not (final / name).is_file()]
    if missing:
        raise RuntimeError(
            f"model cache entry {final} is incomplete (missing {', '.join(missing)}); "
            "delete the directory and it will be built again"
        )
    return final
