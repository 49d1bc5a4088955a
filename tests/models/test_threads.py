"""train.num_threads: "auto" resolved by model size and the cores the process may use."""

import os
import subprocess
import sys

import pytest
import torch

from policyopt.models.threads import (
    SMALL_MODEL_PARAMETERS,
    apply_num_threads,
    available_cores,
    resolve_num_threads,
)


@pytest.mark.parametrize(
    ("parameters", "cores", "threads"),
    [
        (1_100_000, 1, 1),  # the embedded model on one core
        (1_100_000, 2, 2),
        (1_100_000, 16, 2),  # small matrices: at most 2
        (SMALL_MODEL_PARAMETERS - 1, 8, 2),
        (SMALL_MODEL_PARAMETERS, 8, 8),  # SmolLM2-sized and up: every available core
        (135_000_000, 2, 2),
        (135_000_000, 3, 3),
    ],
)
def test_auto_by_model_size_and_cores(parameters, cores, threads):
    assert resolve_num_threads("auto", parameters, cores) == threads


def test_a_number_is_the_override_and_zero_is_torch_default():
    assert resolve_num_threads(3, 135_000_000, cores=2) == 3
    assert resolve_num_threads(0, 1_000, cores=2) == 0
    for bad in (-1, "two", 1.5, True):
        with pytest.raises(ValueError, match="train.num_threads"):
            resolve_num_threads(bad, 1_000, cores=2)


@pytest.mark.slow
def test_available_cores_is_the_affinity_not_the_machine():
    assert available_cores() == len(os.sched_getaffinity(0))
    # One allowed core: auto gives one thread even where the machine has more.
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from policyopt.models.threads import resolve_num_threads as r;"
        "print(r('auto', 10**9))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_apply_sets_torch_threads():
    before = torch.get_num_threads()
    try:
        assert apply_num_threads(1, torch.nn.Linear(4, 4)) == 1
        assert torch.get_num_threads() == 1
        expected = min(available_cores(), 2)
        assert apply_num_threads("auto", torch.nn.Linear(4, 4)) == expected
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_policyopt_shortens_the_openmp_spin_unless_the_user_chose():
    code = "import os, policyopt; print(os.environ.get('GOMP_SPINCOUNT'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}

    def run(extra):
        return subprocess.run(
            [sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True
        ).stdout.strip()

    assert run({}) == "1000"
    assert run({"OMP_WAIT_POLICY": "PASSIVE"}) == "None"
    assert run({"GOMP_SPINCOUNT": "300000"}) == "300000"
    # Too late once torch is imported (libgomp read its settings then): left alone.
    late = "import os, torch, policyopt; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", late], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "None"
