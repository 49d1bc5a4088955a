"""Resuming continues exactly: 4 steps == 2 steps + resume + 2 steps, bit for bit."""

import json

import torch

from policyopt.store.checkpoint import latest_checkpoint, list_checkpoints
from policyopt.tasks.arithmetic import ArithmeticTask
from policyopt.tasks.base import TASKS
from policyopt.train.trainer import Trainer


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run(config, until=None) -> Trainer:
    trainer = Trainer(config)
    trainer.train(until_step=until)
    trainer.close()
    return trainer


def test_resume_is_bit_identical(tmp_path, small_config) -> None:
    straight = Trainer(small_config(tmp_path / "a"))
    before = params(straight.model)
    straight.train()
    after = params(straight.model)
    assert any(not torch.equal(before[k], after[k]) for k in before), (
        "training must move the weights"
    )

    first = run(small_config(tmp_path / "b"), until=2)
    assert first.step == 2
    resumed = Trainer(small_config(tmp_path / "b"))
    assert resumed.step == 2
    resumed.train()
    assert resumed.step == 4
    got = params(resumed.model)
    assert all(torch.equal(after[k], got[k]) for k in after)
    # Optimizer moments continue too (not just the weights).
    s1, s2 = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(s1[i]["exp_avg_sq"], s2[i]["exp_avg_sq"]) for i in s1)


def test_metrics_log_has_each_step_once_after_resume(tmp_path, small_config) -> None:
    run(small_config(tmp_path), until=3)
    run(small_config(tmp_path))
    steps = [
        int(line.split('"step": ')[1].split(",")[0])
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2, 3, 4]


def test_keeps_last_k_checkpoints(tmp_path, small_config) -> None:
    run(small_config(tmp_path, "train.save_every=1", "train.keep_last=2"))
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step-00000003", "step-00000004"]
    ckpt = latest_checkpoint(tmp_path)
    assert (ckpt / "model.safetensors").exists() and (ckpt / "trainer_state.pt").exists()
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "checkpoints").iterdir())


def test_generated_token_budget_stops_the_run_and_survives_resume(tmp_path, small_config) -> None:
    # How many tokens 2 steps generate, then a budget that two steps exceed but one does not.
    probe = Trainer(small_config(tmp_path / "probe", steps=2))
    probe.train()
    one = probe.logger.jsonl.read_text().splitlines()
    per_step = [json.loads(line)["generated_tokens"] for line in one]
    assert probe.generated_tokens == sum(per_step)
    budget = int(per_step[0]) + 1

    limited = Trainer(small_config(tmp_path / "b", f"train.max_generated_tokens={budget}", steps=6))
    limited.train(until_step=1)  # stop after one step, as a killed run would
    assert limited.generated_tokens == per_step[0] < budget
    resumed = Trainer(
        small_config(
            tmp_path / "b", f"train.max_generated_tokens={budget}", "train.plot=true", steps=6
        )
    )
    assert resumed.generated_tokens == per_step[0]  # restored from the checkpoint
    resumed.train()
    # Step 2 crosses the budget: the run ends there, not at step 6.
    assert resumed.step == 2 and resumed.generated_tokens == sum(per_step) >= budget
    assert (tmp_path / "b" / "curves.png").exists()  # a finished run, though short of 6 steps


def test_nonfinite_updates_in_a_row_survive_resume(tmp_path, small_config) -> None:
    """optim.max_nonfinite_updates counts across a restart: a run killed between two skipped
    updates stops where the uninterrupted run would."""
    trainer = Trainer(small_config(tmp_path, steps=1))
    trainer.train()
    trainer.optimization.nonfinite_in_a_row = 2  # the last two updates were skipped
    trainer.optimization.nonfinite_total = 3
    trainer.save()
    resumed = Trainer(small_config(tmp_path, steps=2))
    assert resumed.step == 1
    assert resumed.optimization.nonfinite_in_a_row == 2
    assert resumed.optimization.nonfinite_total == 3


class CountingTask(ArithmeticTask):
    """A task with state (as a live environment has): how many completions it verified."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.verified = 0

    def verify(self, completion, row):
        self.verified += 1
        return super().verify(completion, row)

    def state_dict(self) -> dict:
        return {"verified": self.verified}

    def load_state_dict(self, state: dict) -> None:
        self.verified = state["verified"]


def test_task_state_survives_resume(tmp_path, small_config) -> None:
    """A task's state (DMRL's live environment: its day, deployed document, experiments)
    is saved with the checkpoint and restored, so the resumed run sees the same world."""
    if "counting_arithmetic" not in TASKS:
        TASKS.register("counting_arithmetic")(CountingTask)
    counting = ("task.name=counting_arithmetic", "reward.functions=[{name: task}]")
    straight = Trainer(small_config(tmp_path / "a", *counting, steps=3))
    straight.train()
    first = Trainer(small_config(tmp_path / "b", *counting, steps=3))
    first.train(until_step=2)
    resumed = Trainer(small_config(tmp_path / "b", *counting, steps=3))
    assert resumed.task.verified == first.task.verified > 0
    resumed.train()
    assert resumed.task.verified == straight.task.verified
