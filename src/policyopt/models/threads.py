"""How many intra-op threads torch uses: `train.num_threads`, "auto" by default.

"auto" is the cores this process may run on (`os.sched_getaffinity`, which respects
`taskset`, cgroup cpusets and Slurm's binding), at most `SMALL_MODEL_THREADS` (2) for a
model under `SMALL_MODEL_PARAMETERS` parameters (the embedded 1.1 M-parameter Llama), whose
matrices are too small to split further. A number is used as given; 0 leaves torch's own
default (one thread per core).

Chosen by measurement (studies/record.md, "Threads and load (issue 22)", 2 cores): with
torch's default OpenMP wait (libgomp spins 300,000 times before sleeping), two threads on
cores shared with one or two other CPU-bound jobs made SFT, sampling and the update 3-10x
slower than one thread, because idle threads spin and fight the other jobs for the cores.
`policyopt` therefore shortens the spin to `GOMP_SPINCOUNT=1000` (set in
`policyopt/__init__.py` before torch starts its threads, unless the user chose a wait
policy). With it, two threads are as fast as one with one competing job and at most 2x
slower (sampling) with two, and faster on a quiet machine: SmolLM2's SFT 1.6x, the embedded
model's SFT (the bulk of the quickstart) 1.75x end to end (0.42 s per step on one thread,
0.24 on two). `OMP_WAIT_POLICY=PASSIVE` (no spin) was as robust but made SmolLM2's sampling
1.6x slower on a quiet machine.
"""

from __future__ import annotations

import os

import torch

SMALL_MODEL_PARAMETERS = 10_000_000
SMALL_MODEL_THREADS = 2


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), not all the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_num_threads(setting: int | str, parameters: int, cores: int | None = None) -> int:
    """The thread count for `setting` ("auto", a count, or 0 for torch's default, returned
    as 0) for a model of `parameters` parameters on `cores` available cores."""
    if setting == "auto":
        cores = available_cores() if cores is None else cores
        if cores < 1:
            raise ValueError(f"num_threads auto: {cores} cores available")
        if parameters < SMALL_MODEL_PARAMETERS:
            return min(cores, SMALL_MODEL_THREADS)
        return cores
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
        raise ValueError(f"train.num_threads is {setting!r}: give 'auto', 0 or a count")
    return setting


def apply_num_threads(setting: int | str, model: torch.nn.Module | None) -> int:
    """Set torch's intra-op threads for `model` per `setting`; returns the count in use."""
    parameters = 0 if model is None else sum(p.numel() for p in model.parameters())
    threads = resolve_num_threads(setting, parameters)
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
