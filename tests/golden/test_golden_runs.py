"""Behaviour pinned: each golden run (tests/golden/runs.py) gives the recorded final weights
and metrics lines: the metrics to a relative 1e-5, the weights to 1e-4 of each tensor's norm
(bit for bit with POLICYOPT_GOLDEN_EXACT=1: the runs module says why bits differ between CPUs). Record again with `python tests/golden/record.py`
only for a change of numbers made on purpose (named in the commit)."""

import json
import math
import os
from pathlib import Path

import pytest

from golden.runs import GOLDEN, RUNS, run

RECORDED = json.loads(GOLDEN.read_text())
REL = 1e-5
# The weights are compared more loosely than the metrics: a run's last weights carry every
# step's rounding, and across CPUs (same code, same metrics to 1e-5) the hispo run's
# o_proj sum differed by 2.8e-5 of its norm (AMD EPYC). Any change of a formula
# moves the metrics first, which stay at REL.
WEIGHT_REL = 1e-4


def close(a: object, b: object) -> bool:
    """Equal, floats to a relative REL (absolute REL for values near 0)."""
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=REL, abs_tol=REL)
    return a == b


def metric_differences(got: list[dict], want: list[dict]) -> list[str]:
    if len(got) != len(want):
        return [f"{len(got)} metrics lines, recorded {len(want)}"]
    out = []
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        if sorted(g) != sorted(w):
            out.append(f"line {step}: keys {sorted(set(g) ^ set(w))} differ")
            continue
        out += [f"line {step}: {k} {g[k]!r} != {w[k]!r}" for k in g if not close(g[k], w[k])]
    return out


def weight_differences(got: dict, want: dict) -> list[str]:
    if sorted(got) != sorted(want):
        return [f"tensors {sorted(set(got) ^ set(want))} differ"]
    out = []
    for name, (s, norm, proj) in got.items():
        ws, wnorm, wproj = want[name]
        # Rounding noise of relative size e per entry moves the norm, the sum and the
        # projection by about e * norm: all three are held to WEIGHT_REL * norm.
        scale = WEIGHT_REL * max(wnorm, 1e-6)
        if max(abs(norm - wnorm), abs(s - ws), abs(proj - wproj)) > scale:
            out.append(f"{name}: [{s}, {norm}, {proj}] != [{ws}, {wnorm}, {wproj}]")
    return out


def test_every_run_is_recorded():
    assert sorted(RECORDED) == sorted(RUNS)


def test_tolerance_catches_a_real_change():
    # A change of 1e-3 in one metric (far below any intended change of a formula) fails.
    want = [{"loss": 0.5, "step": 1}]
    assert metric_differences([{"loss": 0.5 + 1e-7, "step": 1}], want) == []
    assert metric_differences([{"loss": 0.5005, "step": 1}], want)
    assert metric_differences([{"loss": 0.5, "step": 2}], want)
    weights = {"w": [3.0, 10.0, -2.0]}
    assert weight_differences({"w": [3.0 + 1e-4, 10.0, -2.0]}, weights) == []
    assert weight_differences({"w": [3.0, 10.0, -2.0 + 2e-3]}, weights)
    assert weight_differences({"w": [3.0, 10.0 + 2e-3, -2.0]}, weights)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_run_is_unchanged(tmp_path, name):
    got = run(name, tmp_path)
    want = RECORDED[name]
    assert got["moved"], f"{name}: the weights did not move, so the run pins nothing"
    assert not metric_differences(got["metrics"], want["metrics"]), (
        name,
        metric_differences(got["metrics"], want["metrics"])[:5],
    )
    assert not weight_differences(got["weights_fingerprint"], want["weights_fingerprint"]), (
        name,
        weight_differences(got["weights_fingerprint"], want["weights_fingerprint"])[:5],
    )
    if os.environ.get("POLICYOPT_GOLDEN_EXACT") == "1":
        assert got["metrics"] == want["metrics"], name
        assert got["weights_sha256"] == want["weights_sha256"], name


@pytest.mark.slow
def test_ranking_run_holds_under_other_cpu_kernels(tmp_path):
    """The srpo_pl golden run within tolerance under ATen's portable kernels: a stand-in for a
    CPU without this one's SIMD (the CI machine may differ from the recording one). A PL
    policy's scores are shift-invariant, so the output bias (and the biases of hidden units
    active on every item) get gradients that are 0 but for rounding; Adam divides them by
    their own size and moves those weights by lr-sized rounding noise unless its eps is large
    against that noise (measured: 14% of the output bias's value between kernel sets)."""
    import subprocess
    import sys

    out = tmp_path / "fingerprint.json"
    script = (
        "import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from golden.runs import run; "
        "json.dump(run('srpo_pl', Path(sys.argv[2])), open(sys.argv[3], 'w'))"
    )
    tests_dir = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    subprocess.run(
        [sys.executable, "-c", script, tests_dir, str(tmp_path / "run"), str(out)],
        check=True,
        env=env,
    )
    got = json.loads(out.read_text())
    want = RECORDED["srpo_pl"]
    assert not metric_differences(got["metrics"], want["metrics"])
    assert not weight_differences(got["weights_fingerprint"], want["weights_fingerprint"])
