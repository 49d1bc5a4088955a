"""Behaviour pinned: each golden run (tests/golden/runs.py) gives the recorded final weights
and metrics lines exactly. Record again with `python tests/golden/record.py` only for a
change of numbers made on purpose (named in the commit)."""

import json

import pytest

from golden.runs import GOLDEN, RUNS, run

RECORDED = json.loads(GOLDEN.read_text())


def test_every_run_is_recorded():
    assert sorted(RECORDED) == sorted(RUNS)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_run_is_unchanged(tmp_path, name):
    got = run(name, tmp_path)
    want = RECORDED[name]
    assert got["moved"], f"{name}: the weights did not move, so the run pins nothing"
    assert got["metrics"] == want["metrics"], name
    assert got["weights_sha256"] == want["weights_sha256"], name
