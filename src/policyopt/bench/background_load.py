"""Competing CPU-bound processes, started and stopped by a measurement itself.

`BackgroundLoad(n, threads)` starts `n` processes, each a torch matrix-multiply loop on
`threads` intra-op threads (torch's default spinning OpenMP pool, as a second training job
on the same machine would run), and stops them on leaving the `with` block, on an error or
a KeyboardInterrupt as well. A burner also exits by itself when the process that started it
is gone (killed without a chance to clean up), so none outlives its measurement.

`python -m policyopt.bench.background_load --threads 2` is one burner.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from types import TracebackType


class BackgroundLoad:
    """`with BackgroundLoad(2):` two competing CPU-bound processes while the block runs."""

    def __init__(self, n: int, threads: int = 2, size: int = 256) -> None:
        if n < 0:
            raise ValueError(f"background load: {n} processes; give 0 or more")
        if threads < 1:
            raise ValueError(f"background load: {threads} threads per process; give 1 or more")
        self.n, self.threads, self.size = n, threads, size
        self.processes: list[subprocess.Popen] = []

    def start(self) -> BackgroundLoad:
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
        env.pop("OMP_WAIT_POLICY", None)  # a competitor with torch's default (spinning) pool
        try:
            for _ in range(self.n):
                self.processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "policyopt.bench.background_load",
                            "--threads",
                            str(self.threads),
                            "--size",
                            str(self.size),
                            "--parent",
                            str(os.getpid()),
                        ],
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def running(self) -> int:
        """How many of the burners are alive."""
        return sum(p.poll() is None for p in self.processes)

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.terminate()
        for p in self.processes:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.processes = []

    def __enter__(self) -> BackgroundLoad:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def burn(threads: int, size: int, parent: int | None) -> None:
    """Multiply matrices until terminated or until `parent` has gone."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    checked = time.monotonic()
    while True:
        for _ in range(20):
            a = torch.tanh(a @ b)
        if parent is not None and time.monotonic() - checked > 1.0:
            checked = time.monotonic()
            if os.getppid() != parent:
                return


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="one CPU-bound competing process")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--parent", type=int, default=None)
    args = p.parse_args(argv)
    burn(args.threads, args.size, args.parent)


if __name__ == "__main__":
    main()
