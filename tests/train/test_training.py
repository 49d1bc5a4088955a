"""End-to-end tiny runs: every baseline preset trains, logs and checkpoints."""

import json

import pytest
import torch

from policyopt.rewards.functions import RewardFunctionError
from policyopt.train.trainer import Trainer
from run_configs import finished_batch, sampled_round


@pytest.mark.parametrize("algo", ["grpo", "dapo", "dr_grpo", "gspo", "rloo", "reinforce_pp"])
def test_presets_train_end_to_end(tmp_path, small_config, algo) -> None:
    trainer = Trainer(small_config(tmp_path, f"algorithm.name={algo}", steps=2))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    trainer.close()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for key in (
        "reward/mean",
        "reward/std",
        "accuracy",
        "response_length/mean",
        "clipfrac_low",
        "clipfrac_high",
        "approx_kl",
        "entropy",
        "grad_norm",
        "tokens_per_s",
        "time/generation",
        "time/scoring",
        "time/training",
    ):
        assert key in records[-1], key
    assert (tmp_path / "samples.jsonl").exists()


def test_kl_to_reference_and_offpolicy_minibatches(tmp_path, small_config) -> None:
    trainer = Trainer(
        small_config(
            tmp_path,
            "algorithm.kl_coef=0.05",
            "algorithm.minibatches=2",
            "algorithm.ppo_epochs=2",
            steps=2,
        )
    )
    metrics = trainer.train()
    trainer.close()
    assert metrics["kl_ref"] >= 0.0
    # Off-policy passes move the policy away from the behaviour policy: ratios leave 1.
    assert metrics["ratio_max"] > 1.0 or metrics["ratio_min"] < 1.0


def test_dynamic_sampling_drops_constant_groups(tmp_path, small_config) -> None:
    # The verifier of the arithmetic task gives an untrained model 0 everywhere: every group
    # is constant, dynamic sampling tries max_sampling_rounds rounds and skips the update.
    trainer = Trainer(
        small_config(
            tmp_path,
            "algorithm.name=dapo",
            "reward.functions=[{name: task}]",
            "algorithm.max_sampling_rounds=2",
            steps=1,
        )
    )
    metrics = trainer.run_step()
    trainer.close()
    assert metrics["filter/rounds"] == 2
    assert metrics["filter/kept_groups"] == 0
    assert metrics["skipped_update"] == 1.0


def test_reward_function_that_raises_names_function_and_sample(tmp_path, small_config) -> None:
    trainer = Trainer(
        small_config(
            tmp_path, "reward.functions=[{name: 'rewards_for_tests:raises_on_odd_answer'}]", steps=1
        )
    )
    with pytest.raises(RewardFunctionError, match=r"raises_on_odd_answer.*sample \d+"):
        trainer.run_step()
    trainer.close()


def test_plot_and_lora(tmp_path, small_config) -> None:
    trainer = Trainer(
        small_config(
            tmp_path,
            "train.plot=true",
            "model.lora.enabled=true",
            "model.lora.rank=1",
            "model.lora.alpha=32",
            "algorithm.kl_coef=0.01",
            steps=2,
        )
    )
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    metrics = trainer.train()
    trainer.close()
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert "kl_ref" in metrics
    assert (tmp_path / "checkpoints" / "step-00000002" / "adapter_model.safetensors").exists()


def shaped_batch(trainer: Trainer):
    """The step batch (rewards shaped, advantages computed) of two prompts' rollouts."""
    return finished_batch(trainer, [0, 1])


def test_update_normalisers_skip_fully_masked_rows(tmp_path, small_config) -> None:
    """A response whose loss is masked out (overlong filtering) is not a sequence of the
    seq-mean denominator: the trainer's loss equals core's on the whole minibatch."""
    from policyopt.core import compute_policy_loss
    from policyopt.core.losses import LossInputs
    from policyopt.models.logprobs import response_logprobs
    from policyopt.train.update import update

    trainer = Trainer(small_config(tmp_path, "optim.lr=1e-12", "optim.max_grad_norm=null", steps=1))
    batch = shaped_batch(trainer)
    batch.loss_mask = batch.rollouts.response_mask.clone()
    batch.loss_mask[0] = 0.0
    r = batch.rollouts
    with torch.no_grad():
        logp = response_logprobs(
            trainer.model, r.input_ids(), r.attention_mask(), r.response_ids.shape[1]
        ).logp
    inputs = LossInputs(logp, logp, batch.advantages, batch.loss_mask)
    expected, _ = compute_policy_loss("ppo_clip", inputs, agg="seq-mean-token-mean")
    metrics = update(trainer.parts.loss, batch, trainer.optimization)
    trainer.close()
    assert metrics["loss"] == pytest.approx(float(expected), abs=1e-6)


def test_update_metrics_do_not_depend_on_micro_batch_size(tmp_path, small_config) -> None:
    """On-policy (one optimizer step) every token ratio is exactly 1: the logged ratio
    metrics must say so however the minibatch is split into micro-batches, and min/max are
    the minibatch's min/max (a regression: the token-weighted sums were divided by the last
    micro-batch's token count, logging ratio_mean ~ 2 with two micro-batches)."""
    from policyopt.train.update import update

    logged = {}
    for micro in (64, 3):
        trainer = Trainer(
            small_config(
                tmp_path / str(micro), "optim.lr=1e-12", f"train.micro_batch_size={micro}", steps=1
            )
        )
        logged[micro] = update(trainer.parts.loss, shaped_batch(trainer), trainer.optimization)
        trainer.close()
    for metrics in logged.values():
        for key in ("ratio_mean", "ratio_min", "ratio_max"):
            assert metrics[key] == pytest.approx(1.0, abs=1e-6), key
        assert metrics["clipfrac_low"] == metrics["clipfrac_high"] == 0.0
    assert logged[3]["loss"] == pytest.approx(logged[64]["loss"], abs=1e-6)


def test_responses_reach_prefetching_rewards_as_they_end(tmp_path, small_config) -> None:
    """Each response that ends with EOS is handed to a reward's `prefetch` with its prompt,
    the text the reward is later called with and its row's columns; truncated ones are not."""
    import rewards_for_tests

    trainer = Trainer(
        small_config(
            tmp_path,
            "reward.functions=[{name: 'rewards_for_tests:digit_fraction_heard'}]",
            "reward.prefetch=true",
            "rollout.max_new_tokens=40",
            steps=1,
        )
    )
    assert trainer.reward_fn.can_prefetch
    heard = rewards_for_tests.digit_fraction_heard.heard
    heard.clear()
    scored = sampled_round(trainer, [0, 1, 2, 3])
    ended = [
        (p, c, a)
        for p, c, a, t in zip(
            scored.prompts,
            scored.completions,
            scored.columns["answer"],
            scored.rollouts.truncated.tolist(),
            strict=True,
        )
        if not t
    ]
    assert ended and sorted(heard) == sorted(ended)
    heard.clear()
    trainer.parts.prefetch = False  # as build_parts binds reward.prefetch=false
    sampled_round(trainer, [0, 1])
    trainer.close()
    assert heard == []  # reward.prefetch=false: scored at the end only


def test_prefetch_auto_is_on_only_where_sampling_leaves_a_core_free(
    tmp_path, small_config, monkeypatch
) -> None:
    from policyopt.train import parts as rollout_phase

    config = small_config(tmp_path, steps=1)
    assert config.reward.prefetch == "auto"
    monkeypatch.setattr(rollout_phase.os, "sched_getaffinity", lambda pid: {0, 1})
    for threads, expected in ((1, True), (2, False)):
        monkeypatch.setattr(rollout_phase.torch, "get_num_threads", lambda n=threads: n)
        assert rollout_phase.prefetch_enabled(config) is expected
    config.model.device = "cuda"
    assert rollout_phase.prefetch_enabled(config) is True  # sampling on the GPU
    config.reward.prefetch = False
    assert rollout_phase.prefetch_enabled(config) is False


def test_samples_hold_the_reference_answer_and_the_check(tmp_path, small_config) -> None:
    """samples.jsonl shows what the completion should have said (the task's answer column)
    and whether the task's check passed, beside the prompt, completion and reward."""
    trainer = Trainer(small_config(tmp_path, "train.log_samples=3", steps=1))
    trainer.train()
    trainer.close()
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 3
    for row in rows:
        assert set(row) >= {"prompt", "completion", "reward", "reference", "correct"}
        # The arithmetic task's answer is the number the prompt's problem evaluates to.
        assert str(int(row["reference"])) == row["reference"]
        answer = trainer.task.extract_answer(row["completion"])
        assert row["correct"] == (answer == row["reference"])
