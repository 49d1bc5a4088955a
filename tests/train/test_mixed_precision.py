"""model.precision=bf16-mixed in training: float32 weights and Adam state, a finite loss that
moves the weights, the trainer-vs-sampler log-prob gap reported and corrected by TIS, SFT."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from policyopt.models.loading import load_model
from policyopt.models.logprobs import naive_response_logprobs
from policyopt.models.precision import set_precision
from policyopt.train.batch import trim
from policyopt.train.sft import sft_backward, sft_examples
from policyopt.train.trainer import Trainer
from policyopt.train.update import update
from run_configs import finished_batch


def mixed_trainer(tmp_path, small_config, *extra: str, steps: int = 2) -> Trainer:
    """A trainer of the tiny model in bf16-mixed (the model marked before the trainer gets
    it, as the config key does)."""
    model, tok = load_model("tiny")
    set_precision(model, "bf16-mixed")
    config = small_config(tmp_path, "model.precision=bf16-mixed", *extra, steps=steps)
    return Trainer(config, model=model, tokenizer=tok)


@pytest.mark.slow
def test_a_bf16_mixed_step_keeps_float32_state_and_moves_the_weights(
    tmp_path, small_config
) -> None:
    trainer = mixed_trainer(tmp_path, small_config)
    try:
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        assert trainer.optimization.tis_cap == 2.0  # auto: the sampler is no longer exact
        metrics = trainer.train()
        after = trainer.model.state_dict()
        assert all(v.dtype == torch.float32 for v in after.values())
        state = [t for s in trainer.optimizer.state.values() for t in s.values() if t.dim()]
        assert state and all(t.dtype == torch.float32 for t in state)  # Adam's moments
        assert any(not torch.equal(before[k], after[k]) for k in before)
    finally:
        trainer.close()
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
    assert 0 < metrics["logp_gap_mean"] < 0.05 and metrics["logp_gap_max"] < 0.5
    assert metrics["tis_weight_mean"] != 1.0


def test_the_gap_and_tis_weights_are_those_computed_independently(tmp_path, small_config) -> None:
    trainer = mixed_trainer(tmp_path, small_config)
    try:
        batch = finished_batch(trainer, [0, 1])
        r, m = batch.rollouts, batch.loss_mask
        ids, mask, width = trim(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
        m, sampled = m[:, :width], r.logp[:, :width]
        with torch.no_grad():
            trained = trainer.policy(ids, mask, width)  # bf16-mixed, before the step
            exact = naive_response_logprobs(trainer.model, ids, mask, width).logp  # float32
        metrics = update(trainer.parts.loss, batch, trainer.optimization)
    finally:
        trainer.close()
    tokens = m.sum()
    gap = float(((trained - sampled).abs() * m).sum() / tokens)
    assert metrics["logp_gap_mean"] == pytest.approx(gap, abs=1e-6)
    # Both sides against an independent float32 forward: the triangle inequality bounds it.
    bound = float((((trained - exact).abs() + (sampled - exact).abs()) * m).sum() / tokens)
    assert 0 < metrics["logp_gap_mean"] <= bound + 1e-6 and bound < 0.05
    # TIS's weights w = min(pi_old / pi_sampler, 2), pi_old the trainer's bf16 forward.
    weights = torch.exp(trained - sampled).clamp(max=2.0)
    assert metrics["tis_weight_mean"] == pytest.approx(float((weights * m).sum() / tokens))


@pytest.mark.slow
def test_fp32_reports_no_gap_unless_tis_is_on(tmp_path, small_config) -> None:
    trainer = Trainer(small_config(tmp_path / "plain", steps=1))
    try:
        assert "logp_gap_mean" not in trainer.train()  # the golden runs' metrics stay as they were
    finally:
        trainer.close()
    trainer = Trainer(small_config(tmp_path / "tis", "algorithm.tis_cap=2.0", steps=1))
    try:
        assert trainer.train()["logp_gap_mean"] < 1e-4  # the hf engine's float32 log-probs
    finally:
        trainer.close()


@pytest.mark.slow
def test_sft_under_bf16_mixed_runs_the_trunk_in_bf16() -> None:
    from policyopt.tasks.base import get_task

    task = get_task("arithmetic")
    losses, grads = {}, {}
    for precision in ("fp32", "bf16-mixed"):
        model, tok = load_model("tiny")
        set_precision(model, precision)
        pairs = sft_examples(task, tok, [task.rows("train")[i] for i in range(8)])
        seen: list[torch.dtype] = []
        hooks = [
            m.register_forward_hook(lambda _m, _a, out, seen=seen: seen.append(out.dtype))
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name != "lm_head"
        ]
        losses[precision] = sft_backward(model, pairs, tok.pad_token_id, buckets=2)
        for h in hooks:
            h.remove()
        want = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
        assert set(seen) == {want}
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())
        grads[precision] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert losses["bf16-mixed"] == pytest.approx(losses["fp32"], rel=1e-2)
    cosine = nn.functional.cosine_similarity(grads["fp32"], grads["bf16-mixed"], dim=0)
    assert float(cosine) > 0.99
