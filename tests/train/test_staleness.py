"""Stale rollouts: the FIFO's versions by hand, and in the trainer k = 0 is the on-policy
step while k > 0 trains on the stored older rollouts with their sampling log-probs."""

from collections import deque
from types import SimpleNamespace

import pytest

from policyopt.train import step as step_module
from policyopt.train.distributed import Dist


def test_fifo_versions_by_hand(monkeypatch):
    """The step's FIFO (`StepState.stale`): with k = 2 step 0 samples 3 batches (2 fill the
    FIFO), every later step 1, and step t trains on the batch of step t - min(t, 2)."""
    sampled = []

    def sample(parts, state, times):
        sampled.append(state.step)
        return None, {}  # no group kept: the step skips its update

    monkeypatch.setattr(step_module, "sample", sample)

    def run(k, steps):
        state = SimpleNamespace(step=0, stale=deque(), dist=Dist())
        versions = []
        for t in range(steps):
            state.step = t
            _, metrics = step_module.train_step(SimpleNamespace(staleness=k), state)
            versions.append(t - metrics["mech/staleness"])
        return versions, [v for v, _ in state.stale]

    versions, left = run(2, 5)
    assert sampled == [0, 0, 0, 1, 2, 3, 4]
    assert versions == [0, 0, 0, 1, 2] and left == [3, 4]  # staleness 0, 1, 2, 2, 2
    sampled.clear()
    assert run(0, 3) == ([0, 1, 2], []) and sampled == [0, 1, 2]


def run_with_captured_batches(tmp_path, monkeypatch, name, extra):
    """Train 4 small steps; every generated rollout batch and every trained batch."""
    from policyopt.config.load import load_config
    from policyopt.train import step as step_module
    from policyopt.train.trainer import Trainer
    from run_configs import small_overrides

    sampled, trained = [], []
    real_sample, real_update = step_module.sample, step_module.update

    def sample(parts, state, times):
        kept, stats = real_sample(parts, state, times)
        sampled.append(kept.rollouts)
        return kept, stats

    def update(loss, batch, opt):
        trained.append((batch.rollouts, opt.behaviour_old_logp))
        return real_update(loss, batch, opt)

    monkeypatch.setattr(step_module, "sample", sample)
    monkeypatch.setattr(step_module, "update", update)
    config = load_config(None, [*small_overrides(tmp_path / name), *extra])
    trainer = Trainer(config)
    try:
        trainer.train()
        weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
    return sampled, trained, weights


@pytest.mark.slow
def test_k0_is_the_on_policy_step_and_k2_trains_on_rollouts_two_steps_old(tmp_path, monkeypatch):
    import json

    import torch

    sampled0, trained0, w_default = run_with_captured_batches(tmp_path, monkeypatch, "d", [])
    _, _, w_k0 = run_with_captured_batches(tmp_path, monkeypatch, "k0", ["rollout.staleness=0"])
    # k = 0: each step trains on what it sampled, and the run is the same as without the key.
    assert [r for r, _ in trained0] == sampled0 and not any(b for _, b in trained0)
    assert all(torch.equal(w_default[k], w_k0[k]) for k in w_default)
    sampled, trained, _ = run_with_captured_batches(
        tmp_path, monkeypatch, "k2", ["rollout.staleness=2", "algorithm.minibatches=2"]
    )
    # Step 0 samples 3 batches with the initial policy (2 fill the FIFO), then 1 per step.
    assert len(sampled) == 3 + 3 and len(trained) == 4
    assert [r for r, _ in trained] == sampled[:4]  # versions 0, 0, 0, 1
    assert all(behaviour for _, behaviour in trained)  # old log-probs = sampling log-probs
    records = [json.loads(x) for x in (tmp_path / "k2" / "metrics.jsonl").read_text().splitlines()]
    assert [r["mech/staleness"] for r in records] == [0.0, 1.0, 2.0, 2.0]
    # Off-policy by two steps: the ratio moved away from 1.
    assert records[-1]["mech/ratio_std"] > 0 and records[-1]["mech/kl_old_new"] > 0


def test_behaviour_log_probs_are_the_old_log_probs(tmp_path):
    """With staleness the update's old log-probs are the rollouts' sampling log-probs: at
    the first step (nothing updated yet) the ratio is ~1 even with 2 minibatches' first
    pass; the first minibatch sees the sampling policy exactly."""
    import json

    from policyopt.config.load import load_config
    from policyopt.train.trainer import Trainer
    from run_configs import small_overrides

    config = load_config(None, [*small_overrides(tmp_path / "b", steps=1), "rollout.staleness=1"])
    trainer = Trainer(config)
    try:
        trainer.train()
    finally:
        trainer.close()
    record = json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[0])
    # Sampling and training log-probs of the same weights agree to float error.
    assert abs(record["mech/ratio_mean"] - 1) < 1e-4 and record["mech/kl_old_new"] < 1e-6
