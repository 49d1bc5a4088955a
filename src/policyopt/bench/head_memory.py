"""Peak memory of the LM head's log-probs: chunked + checkpointed vs full logits.

Each variant runs forward + backward of a synthetic head (Linear hidden -> vocab, no bias)
over batch * length random hidden states, in its own subprocess, and reports the rise of the
process's peak resident set size over the state after setup and a tiny warm-up. A fresh
process per variant keeps one variant's allocations out of the other's peak.

On Linux the peak is VmHWM from /proc/self/status, reset just before the measured run (writing
5 to /proc/self/clear_refs). `getrusage` maxrss is only a fallback: it is never reset and
even carries over the parent's peak across fork + exec, so it can hide the rise entirely.
The child runs with glibc's MALLOC_MMAP_THRESHOLD_=65536: every large buffer is then its own
mmap, returned to the OS when freed, so the resident set follows the live tensors instead of
the heap's fragmentation (otherwise freed chunk buffers linger and inflate the peak).

Run by hand: `python -m policyopt.bench.head_memory` (prints the dict as JSON).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("naive", "chunked")


def _measure(variant: str, vocab: int, hidden: int, rows: int, chunk_size: int) -> dict:
    """Forward + backward of one variant in this process; peak RSS rise in MiB and seconds."""
    import torch

    from policyopt.models.logprobs import chunked_head_logprobs, naive_head_logprobs

    def run(h: torch.Tensor, y: torch.Tensor) -> None:
        if variant == "naive":
            logp = naive_head_logprobs(h, y, head)
        else:
            logp, _ = chunked_head_logprobs(h, y, head, chunk_size=chunk_size)
        logp.sum().backward()

    torch.manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    h = torch.randn(rows, hidden, requires_grad=True)
    y = torch.randint(vocab, (rows,))
    run(h[:4], y[:4])  # warm-up: one-time allocations (kernels, thread pools, .grad buffers)
    before = _reset_peak_kib()
    start = time.perf_counter()
    run(h, y)
    seconds = time.perf_counter() - start
    return {"peak_mib": (_peak_kib() - before) / 1024, "seconds": seconds}


def _reset_peak_kib() -> float:
    """Reset the peak-RSS counter where the OS allows it; return the current peak in KiB."""
    with contextlib.suppress(OSError):  # not Linux, or not allowed: fall back to no reset
        Path("/proc/self/clear_refs").write_text("5")
    return _peak_kib()


def _peak_kib() -> float:
    """Peak resident set size of this process in KiB."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1])
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 1024 if sys.platform == "darwin" else float(maxrss)  # bytes on macOS


def head_memory_benchmark(
    vocab: int = 49152,
    hidden: int = 576,
    batch: int = 8,
    length: int = 512,
    chunk_size: int = 1024,
) -> dict:
    """Peak-memory rise (MiB) and time of naive vs chunked head log-probs, forward+backward.

    Defaults: SmolLM2's vocabulary and width over 8 x 512 response tokens. Also reports the
    size of one full float32 logits tensor, `logits_mib` = batch * length * vocab * 4 bytes.
    """
    import torch

    src_root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([src_root, os.environ.get("PYTHONPATH", "")]),
        "MALLOC_MMAP_THRESHOLD_": "65536",
    }
    args = [vocab, hidden, batch * length, chunk_size, torch.get_num_threads()]
    result: dict = {
        "vocab": vocab,
        "hidden": hidden,
        "batch": batch,
        "length": length,
        "chunk_size": chunk_size,
        "logits_mib": batch * length * vocab * 4 / 2**20,
    }
    for variant in VARIANTS:
        proc = subprocess.run(
            [sys.executable, "-m", "policyopt.bench.head_memory", variant, *map(str, args)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"memory benchmark variant {variant!r} failed:\n{proc.stderr}")
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        result[f"{variant}_peak_mib"] = measured["peak_mib"]
        result[f"{variant}_seconds"] = measured["seconds"]
    return result


def main(argv: list[str]) -> None:
    """`python -m policyopt.bench.head_memory VARIANT VOCAB HIDDEN ROWS CHUNK THREADS` measures one variant (child
    process); with no arguments runs the whole benchmark at its defaults."""
    if not argv:
        print(json.dumps(head_memory_benchmark(), indent=2))
        return
    variant, vocab, hidden, rows, chunk_size, threads = argv
    if variant not in VARIANTS:
        raise SystemExit(f"head_memory: unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    import torch

    torch.set_num_threads(int(threads))
    print(json.dumps(_measure(variant, int(vocab), int(hidden), int(rows), int(chunk_size))))


if __name__ == "__main__":
    main(sys.argv[1:])
