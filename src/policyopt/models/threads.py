"""How many intra-op threads torch uses: `train.num_threads`, "auto" by default.

"auto" is the cores this process may run on (`os.sched_getaffinity`, which respects
`taskset`, cgroups' cpusets and Slurm's binding), at most `SMALL_MODEL_THREADS` for a model
under `SMALL_MODEL_PARAMETERS` parameters, whose matrices are too small to split further.
A number is used as given; 0 leaves torch's own default (one thread per physical core).

Chosen by measurement (docs/results.md, "Threads and load (issue 22)"): with torch's
default OpenMP wait policy, two threads on two cores shared with one or two other CPU-bound
jobs made SFT and RL steps 3-10x slower than one thread, because idle OpenMP threads spin
and fight the other jobs for the cores. `policyopt` therefore asks OpenMP to wait passively
(`OMP_WAIT_POLICY=PASSIVE`, set in `policyopt/__init__.py` before torch starts its threads,
unless the user set a wait policy). With it, two threads cost about the same as one under
load and are 1.2-1.5x faster on a quiet machine, so "auto" uses the cores.
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
