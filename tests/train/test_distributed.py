"""Data parallelism on CPU with gloo: 2 processes equal 1 on the same global batch (DDP and
FSDP2, every aggregation mode), and a 2-process FSDP2 run resumes from its checkpoint, on 2
processes and on 1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from policyopt.train.distributed import (
    Dist,
    rank_slice,
    reduce_metrics,
    resolve_mode,
    share,
)
from run_configs import small_overrides

HERE = Path(__file__).parent
TIMEOUT = 540  # a hung collective fails the test instead of hanging CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    src = Path(__file__).parents[2] / "src"
    paths = [str(src), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "OMP_NUM_THREADS": "1",
    }


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        *args,
    ]
    result = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


# ------------------------------------------------------------------ pure helpers
def test_share_and_rank_slice_give_whole_groups_per_rank() -> None:
    two = [Dist(rank=r, world=2, mode="ddp") for r in range(2)]
    assert share(8, two[0]) == 4
    assert rank_slice(list(range(10, 18)), two[0]) == [10, 11, 12, 13]
    assert rank_slice(list(range(10, 18)), two[1]) == [14, 15, 16, 17]
    with pytest.raises(ValueError, match="prompts_per_step=3 is not divisible by the 2"):
        share(3, two[0])


def test_resolve_mode() -> None:
    assert resolve_mode("auto", 1) == "none"
    assert resolve_mode("auto", 2) == "ddp"
    assert resolve_mode("fsdp2", 2) == "fsdp2"
    with pytest.raises(ValueError, match="train.parallel=none but WORLD_SIZE=2"):
        resolve_mode("none", 2)


def test_reduce_metrics_without_a_group_is_the_identity() -> None:
    m = {"loss": 1.5, "leaves": 8.0}
    assert reduce_metrics(Dist(), m) == m


# ------------------------------------------------------------------ 2 processes vs 1
@pytest.mark.slow
def test_two_processes_equal_one_on_the_same_global_batch(tmp_path: Path) -> None:
    """Loss, grad norm and every gradient of both optimizer steps (ppo_epochs=2: the second
    off-policy, with clipping) equal the single-process run's, under DDP and FSDP2, for
    every aggregation mode, GSPO and the KL term; rank 0 holds 6 rows, rank 1 only 4 (the
    micro-batch replay keeps the collectives in step). The worker also checks REINFORCE++'s
    global batch statistics through `global_rows`."""
    worker = str(HERE / "dist_worker.py")
    single = subprocess.run(
        [sys.executable, worker, str(tmp_path)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert single.returncode == 0, single.stderr[-4000:]
    torchrun(2, worker, str(tmp_path))
    ref = torch.load(tmp_path / "none.pt")
    for mode in ("ddp", "fsdp2"):
        got = torch.load(tmp_path / f"{mode}.pt")
        assert got.keys() == ref.keys()
        for name, want in ref.items():
            have = got[name]
            where = f"{mode}/{name}"
            assert have["loss"] == pytest.approx(want["loss"], abs=1e-6), where
            assert have["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-6, abs=1e-6), where
            assert len(have["grads"]) == len(want["grads"]) == 2, where
            for step_have, step_want in zip(have["grads"], want["grads"], strict=True):
                assert len(step_have) == len(step_want), where
                for g_have, g_want in zip(step_have, step_want, strict=True):
                    torch.testing.assert_close(g_have, g_want, atol=1e-6, rtol=0, msg=where)
            # The update did something: gradients are not all zero.
            assert any(float(g.abs().max()) > 1e-4 for g in want["grads"][0]), where


# ------------------------------------------------------------------ resume
def train_args(out: Path, steps: int, *extra: str) -> list[str]:
    return [
        "-m",
        "policyopt.cli.main",
        "train",
        *small_overrides(out, steps),
        "rollout.max_new_tokens=8",
        "eval.size=4",
        *extra,
    ]


@pytest.mark.slow
def test_fsdp2_run_resumes_from_its_checkpoint_on_two_processes_and_on_one(
    tmp_path: Path,
) -> None:
    """2 steps straight equal 1 step, a restart, 1 step (2 processes, FSDP2: sharded DCP
    model and optimizer state, each rank's RNG); the same 1-step checkpoint also resumes in
    one process (no torchrun) with the DCP state resharded onto the whole model."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    torchrun(2, *train_args(straight, 2, "train.parallel=fsdp2"))
    torchrun(2, *train_args(split, 1, "train.parallel=fsdp2"))
    one = split / "checkpoints" / "step-00000001"
    assert (one / "dcp" / ".metadata").exists() and (one / "model.safetensors").exists()
    single = tmp_path / "single"
    import shutil

    shutil.copytree(split, single)
    resumed = torchrun(2, *train_args(split, 2, "train.parallel=fsdp2"))
    assert "resuming from step" in resumed.stdout + resumed.stderr
    final = "checkpoints/step-00000002/model.safetensors"
    a, b = load_file(straight / final), load_file(split / final)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)
    assert a.keys() == load_file(one / "model.safetensors").keys()
    changed = any(not torch.equal(a[k], load_file(one / "model.safetensors")[k]) for k in a)
    assert changed, "the resumed step did not change the weights"

    # One process, no torchrun: the checkpoint's sharded state loads into the whole model.
    from policyopt.config.load import load_config
    from policyopt.train.trainer import Trainer

    overrides = train_args(single, 2)[3:]
    trainer = Trainer(load_config(None, overrides))
    try:
        assert trainer.step == 1 and trainer.dist.mode == "none"
        saved = load_file(one / "model.safetensors")
        for name, p in trainer.model.named_parameters():
            torch.testing.assert_close(p.detach(), saved[name], atol=0, rtol=0, msg=name)
        state = trainer.optimizer.state
        assert state and all("exp_avg" in s for s in state.values())
        trainer.train()
        assert trainer.step == 2
    finally:
        trainer.close()


@pytest.mark.slow
def test_ddp_checkpoint_resumes_under_fsdp2(tmp_path: Path) -> None:
    """A 2-process DDP run writes the single-process checkpoint (rank 0); a 2-process FSDP2
    run continues it, scattering the full weights and the id-keyed optimizer state to its
    shards, and its next checkpoint holds the sharded state."""
    out = tmp_path / "run"
    torchrun(2, *train_args(out, 1, "train.parallel=ddp"))
    one = out / "checkpoints" / "step-00000001"
    assert (one / "model.safetensors").exists() and not (one / "dcp").exists()
    resumed = torchrun(2, *train_args(out, 2, "train.parallel=fsdp2"))
    assert "resuming from step" in resumed.stdout + resumed.stderr
    two = out / "checkpoints" / "step-00000002"
    assert (two / "dcp" / ".metadata").exists()
    before, after = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # The optimizer state went through: the step-2 shards hold Adam state for every
    # parameter, 2 steps old (1 under DDP + 1 under FSDP2), read back in one process by
    # torch's DCP converter.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(two / "dcp", tmp_path / "two.pt")
    optim = torch.load(tmp_path / "two.pt", weights_only=False)["optim"]
    assert {k.removeprefix("policy.") for k in optim["state"]} == set(after)
    assert all(int(s["step"]) == 2 and "exp_avg" in s for s in optim["state"].values())
