"""curves.png panels (loss, per reward function) and TensorBoard's sample text and
before/after-RL evaluations."""

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from policyopt.store.metrics_log import MetricsLogger
from policyopt.store.plot import plot_metrics, reward_function_keys


def test_reward_function_panel_keys_and_plot(tmp_path):
    records = [
        {"step": s, "reward/mean": 0.1 * s, "reward/std": 0.2, "reward/task": 0.1 * s,
         "reward/format": 1.0, "reward/format/unparseable": 0.0, "loss": 0.5, "approx_kl": 0.01}
        for s in (1, 2, 3)
    ]  # fmt: skip
    assert reward_function_keys(records) == ["reward/format", "reward/task"]
    out = plot_metrics(records, tmp_path / "curves.png", "grpo")
    assert out is not None and out.stat().st_size > 0


def test_tensorboard_gets_sample_text_and_evaluations(tmp_path):
    logger = MetricsLogger(tmp_path, ["jsonl", "tensorboard"], {})
    logger.log_samples(1, [{"prompt": "1+2=?", "completion": "A:3", "reward": 1.0}])
    logger.log_eval(0, "eval_before_rl", {"eval/accuracy": 0.25, "eval/pass@2": 0.5})
    logger.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert "eval_before_rl/accuracy" in acc.Tags()["scalars"]
    assert acc.Scalars("eval_before_rl/pass@2")[0].value == 0.5
    texts = acc.Tags()["tensors"]
    assert any("samples" in t for t in texts)
    # metrics.jsonl keeps one record per training step: evaluations are not added to it
    assert not (tmp_path / "metrics.jsonl").exists()
