"""Training steps on multi-turn episodes with every kind of part: losses, estimators,
shapers, filters, staleness and TIS, LoRA, the KL term and several updates per batch; the
environment's tokens are in no loss mask; held-out evaluation plays episodes; data
parallelism gives the single process's update on a multi-turn batch."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_distributed import TIMEOUT, env, torchrun

from policyopt.config.load import load_config
from policyopt.rollout.environment import ENVIRONMENTS, Environment, Episode, Reply
from policyopt.train.step import train_step
from policyopt.train.trainer import Trainer
from run_configs import small_overrides


class Echo(Environment):
    """Replies `=ok` and a newline to every turn: every episode runs to its budgets."""

    def start(self, prompt: str, row) -> Episode:  # noqa: ANN001
        class _Episode(Episode):
            def step(self, turn: str) -> Reply:
                return Reply(messages=({"role": "tool", "content": "=ok\n"},))

        return _Episode()


if "echo_for_tests" not in ENVIRONMENTS:
    ENVIRONMENTS.register("echo_for_tests")(Echo)

MULTI_TURN = [
    "rollout.strategy=multi_turn",
    "rollout.strategy_options={environment: echo_for_tests, max_turns: 3, max_turn_tokens: 4}",
    "rollout.max_new_tokens=20",
]

CASES = {
    "grpo": [],
    "dapo": ["algorithm.name=dapo", "algorithm.max_sampling_rounds=1"],
    "gspo": ["algorithm.name=gspo"],
    "hispo": ["algorithm.name=hispo"],
    "dr_grpo": ["algorithm.name=dr_grpo"],
    "rloo": ["algorithm.name=rloo"],
    "reinforce_pp": ["algorithm.name=reinforce_pp"],
    "stale_tis": ["rollout.staleness=1", "algorithm.tis_cap=2.0"],
    "lora": ["model.lora.enabled=true"],
    "kl_epochs": ["algorithm.kl_coef=0.05", "algorithm.ppo_epochs=2", "algorithm.minibatches=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_step_on_episodes(tmp_path, case):
    config = load_config(overrides=[*small_overrides(tmp_path, 2), *MULTI_TURN, *CASES[case]])
    trainer = Trainer(config)
    try:
        for _ in range(2):
            trained, metrics = train_step(trainer.parts, trainer.state)
            trainer.state.step += 1
        assert trained is not None, case
        r = trained.rollouts
        turns = r.structure["turn_ids"]
        replies = (r.response_mask == 0) & (turns > 0)
        assert replies.any() and int(turns.max()) >= 2, case
        assert (trained.loss_mask[replies] == 0).all(), case
        assert torch.isfinite(torch.tensor(metrics["loss"])), case
        assert metrics["grad_norm"] > 0, case
    finally:
        trainer.close()


@pytest.mark.slow
def test_held_out_evaluation_plays_episodes(tmp_path):
    config = load_config(overrides=[*small_overrides(tmp_path, 1), *MULTI_TURN, "eval.size=4"])
    trainer = Trainer(config)
    try:
        result = trainer.evaluate()
    finally:
        trainer.close()
    # every greedy episode: turns of 4 tokens with a 4-token reply in between, 20 at most
    assert result["eval/response_tokens_median"] > 4 + 4


@pytest.mark.slow
def test_two_processes_equal_one_on_a_multi_turn_batch(tmp_path, monkeypatch):
    """tests/train/test_distributed.py's check (loss, grad norm and every gradient of two
    optimizer steps; every aggregation mode, GSPO, the KL term) under DDP, on a batch whose
    responses hold environment tokens between model tokens."""
    worker = str(Path(__file__).parent / "multiturn_dist_worker.py")
    single = subprocess.run(
        [sys.executable, worker, str(tmp_path)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert single.returncode == 0, single.stderr[-4000:]
    monkeypatch.setenv("DIST_WORKER_MODES", "ddp")
    torchrun(2, worker, str(tmp_path))
    ref, got = torch.load(tmp_path / "none.pt"), torch.load(tmp_path / "ddp.pt")
    assert got.keys() == ref.keys()
    for name, want in ref.items():
        have = got[name]
        assert have["loss"] == pytest.approx(want["loss"], abs=1e-6), name
        assert have["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-6, abs=1e-6), name
        for step_have, step_want in zip(have["grads"], want["grads"], strict=True):
            for g_have, g_want in zip(step_have, step_want, strict=True):
                torch.testing.assert_close(g_have, g_want, atol=1e-6, rtol=0, msg=name)
