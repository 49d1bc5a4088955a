"""A full disk during an FSDP2 checkpoint save (torch.distributed.checkpoint) is the same one
line as in one process: "no space left on PATH ...; the last complete checkpoint is step N",
with the partial folder removed and the previous complete checkpoint kept. In one process
(an FSDP2 group of one, in this process) and under torchrun with 2 processes, where only
rank 1's shard write fails and rank 0 must not wait for it forever."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from full_disk_worker import FAILURES, fsdp2_argv, full_disk_save

from policyopt.cli.main import main
from policyopt.store import checkpoint as ckpt

HERE = Path(__file__).parent
TIMEOUT = 300  # a rank left waiting fails the test instead of hanging it


def assert_one_line_and_step_1_kept(err: str, run: Path) -> None:
    assert "Traceback" not in err, err
    head = "policyopt train: "
    assert head in err, err
    line = err[err.index(head) :].strip()
    assert "\n" not in line, err
    assert f"no space left on {run / 'checkpoints'}" in line
    assert "to save step 2" in line
    assert "the last complete checkpoint is step 1" in line
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-00000001"]
    assert (ckpt.latest_checkpoint(run) / "dcp").is_dir()  # the FSDP2 layout
    assert not list(ckpt.checkpoint_root(run).glob(".tmp-*"))  # the partial folder is gone


@pytest.mark.slow
@pytest.mark.parametrize("where", ["shards", "rank0"])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_full_disk_during_an_fsdp2_save_is_one_line(
    tmp_path, capsys, monkeypatch, where, failure
) -> None:
    run = tmp_path / "run"
    # An FSDP2 group of one in this process; its rendezvous variables go with the test.
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch, "save", full_disk_save(run, where, failure))
    monkeypatch.setattr(ckpt, "free_space", lambda path: 0)  # what a full disk reports
    assert main(fsdp2_argv(run)) == 1
    assert not torch.distributed.is_initialized()  # the group went with the run
    assert_one_line_and_step_1_kept(capsys.readouterr().err, run)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_full_disk_on_one_rank_of_two_is_one_line_on_every_rank(tmp_path) -> None:
    run = tmp_path / "run"
    src = Path(__file__).parents[2] / "src"
    paths = [str(src), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(HERE / "full_disk_worker.py"),
        str(run),
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode != 0
    for rank in (0, 1):
        code, err = (run.parent / f"rank{rank}.txt").read_text().split("\n", 1)
        assert code == "1", err
        assert_one_line_and_step_1_kept(err, run)
