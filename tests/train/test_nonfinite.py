"""A non-finite loss or gradient: the optimizer step is skipped, logged and counted, and the
run stops after `optim.max_nonfinite_updates` in a row; the parameters never see a NaN."""

import json

import pytest
import torch

from policyopt.train import update
from policyopt.train.trainer import Trainer
from policyopt.train.update import NonFiniteUpdateError
from run_configs import finished_batch


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def shaped_batch(trainer: Trainer):
    return finished_batch(trainer, [0, 1])


def policy_update(trainer: Trainer, batch) -> dict[str, float]:
    return update.update(trainer.parts.loss, batch, trainer.optimization)


COMPUTE_POLICY_LOSS = update.apply_policy_loss


def nan_loss(*args, **kwargs):
    loss, metrics = COMPUTE_POLICY_LOSS(*args, **kwargs)
    return loss * float("nan"), metrics


def nan_gradient(*args, **kwargs):
    """A finite loss whose gradient is NaN (a backward hook poisons it)."""
    loss, metrics = COMPUTE_POLICY_LOSS(*args, **kwargs)
    logp = args[2].logp  # (what, fn, LossInputs)
    logp.register_hook(lambda g: torch.full_like(g, float("nan")))
    return loss, metrics


@pytest.mark.parametrize("poison", [nan_loss, nan_gradient])
def test_a_nonfinite_update_is_skipped_and_counted(tmp_path, small_config, monkeypatch, poison):
    trainer = Trainer(small_config(tmp_path, "optim.lr=0.01", steps=1))
    batch = shaped_batch(trainer)
    monkeypatch.setattr(update, "apply_policy_loss", poison)
    before = snapshot(trainer.model)
    metrics = policy_update(trainer, batch)
    trainer.close()
    assert same(before, snapshot(trainer.model))  # no parameter moved
    assert not trainer.optimizer.state  # Adam's moments never saw the NaN
    assert all(p.grad is None for p in trainer.model.parameters())
    assert metrics["nonfinite/skipped_updates"] == 1.0
    assert metrics["nonfinite/in_a_row"] == 1.0
    assert trainer.optimization.nonfinite_in_a_row == 1


def test_a_finite_update_resets_the_count_and_moves_the_parameters(tmp_path, small_config):
    trainer = Trainer(small_config(tmp_path, "optim.lr=0.01", steps=1))
    trainer.optimization.nonfinite_in_a_row = 2
    before = snapshot(trainer.model)
    metrics = policy_update(trainer, shaped_batch(trainer))
    trainer.close()
    assert not same(before, snapshot(trainer.model))
    assert metrics["nonfinite/skipped_updates"] == 0.0
    assert trainer.optimization.nonfinite_in_a_row == 0


def read_log(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def poison_steps(trainer: Trainer, steps: set[int], monkeypatch) -> None:
    """The policy loss is NaN during the given training steps (0-based)."""

    def loss(*args, **kwargs):
        value, metrics = COMPUTE_POLICY_LOSS(*args, **kwargs)
        return (value * float("nan") if trainer.step in steps else value), metrics

    monkeypatch.setattr(update, "apply_policy_loss", loss)


def test_two_nonfinite_steps_are_skipped_and_the_run_goes_on(tmp_path, small_config, monkeypatch):
    trainer = Trainer(small_config(tmp_path, "optim.lr=0.01", steps=3))
    poison_steps(trainer, {0, 1}, monkeypatch)
    before = snapshot(trainer.model)
    trainer.train(until_step=2)
    assert same(before, snapshot(trainer.model))
    trainer.train()
    trainer.close()
    assert not same(before, snapshot(trainer.model))  # step 3 is finite: it updates
    log = read_log(tmp_path)
    assert [r["nonfinite/skipped_updates"] for r in log] == [1.0, 1.0, 0.0]
    assert [r["nonfinite/in_a_row"] for r in log] == [1.0, 2.0, 0.0]
    assert log[-1]["nonfinite/total"] == 2.0


def test_the_run_stops_after_max_nonfinite_updates_in_a_row(tmp_path, small_config, monkeypatch):
    cfg = small_config(tmp_path, "optim.max_nonfinite_updates=2", "train.log_every=5", steps=4)
    trainer = Trainer(cfg)
    poison_steps(trainer, {0, 1, 2, 3}, monkeypatch)
    before = snapshot(trainer.model)
    with pytest.raises(NonFiniteUpdateError, match=r"2 .*in a row.*optim\.max_nonfinite_updates"):
        trainer.train()
    trainer.close()
    assert trainer.step == 2
    assert same(before, snapshot(trainer.model))
    # The halting step is logged (log_every does not hide it).
    assert [r["step"] for r in read_log(tmp_path)] == [2]
    assert read_log(tmp_path)[0]["nonfinite/in_a_row"] == 2.0


def test_max_nonfinite_updates_is_validated() -> None:
    from policyopt.config.load import ConfigError, load_config

    assert load_config().optim.max_nonfinite_updates == 3
    with pytest.raises(ConfigError, match="max_nonfinite_updates"):
        load_config(overrides=["optim.max_nonfinite_updates=0"])
