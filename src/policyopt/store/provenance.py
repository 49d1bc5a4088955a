"""Whether a saved run config was written by this user's policyopt, or came from elsewhere.

A checkpoint's `run_config.yaml` is signed when the checkpoint is completed
(`checkpoint.finish_checkpoint`): an HMAC-SHA256 of its bytes under a key that only this
user can read (`<policyopt cache>/run-signing-key`, mode 0600, made on first use), written
beside it as `run_config.yaml.sig`. A run folder received from someone else carries either
no signature or one made with their key, so `signed_here` is false for it, and code its
config names is not run without the user's say-so (`policyopt eval --allow-run-code`); a
run this user trained evaluates without the flag. A config edited after its checkpoint
was saved no longer verifies either.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from policyopt.models.cache import cache_dir

KEY_FILE = "run-signing-key"
SUFFIX = ".sig"


def _key() -> bytes:
    path = cache_dir() / KEY_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
    return path.read_text().strip().encode()


def _digest(path: Path) -> str:
    return hmac.new(_key(), path.read_bytes(), hashlib.sha256).hexdigest()


def sign(path: Path) -> None:
    """Write `path`'s signature beside it (`<name>.sig`)."""
    path.with_name(path.name + SUFFIX).write_text(_digest(path))


def signed_here(path: Path) -> bool:
    """Whether `path` carries a valid signature made with this user's key."""
    sig = path.with_name(path.name + SUFFIX)
    try:
        return hmac.compare_digest(sig.read_text().strip(), _digest(path))
    except OSError:
        return False
