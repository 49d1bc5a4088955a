"""algorithm.tis_cap in a training run: off by default with the HF engine, on when set."""

from policyopt.store.metrics_log import read_metrics
from policyopt.train.trainer import Trainer


def test_tis_is_off_with_hf_by_default_and_logged_when_set(tmp_path, small_config) -> None:
    default = Trainer(small_config(tmp_path / "auto", steps=1))
    assert default.optimization.tis_cap is None  # hf's log-probs are the trainer's own
    default.close()
    trainer = Trainer(small_config(tmp_path / "on", "algorithm.tis_cap=2.0", steps=2))
    try:
        assert trainer.optimization.tis_cap == 2.0
        trainer.train()
    finally:
        trainer.close()
    rows = read_metrics(tmp_path / "on" / "metrics.jsonl")
    # The HF engine's sampling log-probs equal the trainer's (to ~1e-6): weights are ~1.
    assert all(abs(r["tis_weight_mean"] - 1.0) < 1e-3 for r in rows)
