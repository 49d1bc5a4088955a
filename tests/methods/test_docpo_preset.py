"""The `docpo` preset and recipes, and two training steps of DocPO on the docparse task
through the trainer: per-type shaping metrics logged, held-out evaluation with the task."""

import json
import math
from pathlib import Path

import pytest
import torch

from policyopt.config.load import load_config
from policyopt.envs.docparse.task import MAX_REFERENCE_CHARS
from policyopt.methods import PRESETS
from policyopt.methods.docpo import step_aware_gamma
from policyopt.recipes import recipe_config
from policyopt.train.trainer import Trainer

torch.set_num_threads(1)

TYPES = {"text", "table", "formula"}


def test_preset_values():
    cfg = load_config(overrides=["algorithm.name=docpo"])
    alg = cfg.algorithm
    assert (alg.advantage, alg.loss, alg.kl_coef, alg.group_filter) == (
        "grpo",
        "ppo_clip",
        0.0,
        "docpo",
    )
    from policyopt.config.check import loss_settings

    s = loss_settings(cfg)
    assert (s["clip_low"], s["clip_high"], alg.dynamic_sampling) == (0.2, 0.2, False)
    assert cfg.rollout.group_size == 8
    assert [f.name for f in cfg.reward.functions] == ["docparse"]
    assert [s.name for s in cfg.reward.shapers] == ["step_aware_annealing"]
    assert cfg.reward.correct_threshold == 0.99
    assert PRESETS.get("docpo")["algorithm"]["name"] == "docpo"


def test_recipes_share_grpo_rollout_budget_and_differ_only_in_the_shaper():
    grpo = recipe_config("grpo", [], None, None)
    saa = recipe_config("docpo", [], None, None)
    nosaa = recipe_config("docpo_nosaa", [], None, None)
    for cfg in (saa, nosaa):
        assert cfg.algorithm.name == "docpo" and cfg.task.name == "docparse"
        assert cfg.algorithm.group_filter == "docpo"
        assert [f.name for f in cfg.reward.functions] == ["docparse"]
        # Its own RL steps (those its README measurements used); grpo's lr and seed.
        assert (cfg.train.steps, cfg.optim.lr) == (120, grpo.optim.lr)
        assert cfg.train.seed == grpo.train.seed
        for key in ("prompts_per_step", "group_size", "temperature"):
            assert getattr(cfg.rollout, key) == getattr(grpo.rollout, key)
        assert cfg.rollout.max_new_tokens >= MAX_REFERENCE_CHARS + 1  # longest target + EOS
    assert [s.name for s in saa.reward.shapers] == ["step_aware_annealing"]
    assert nosaa.reward.shapers == []
    # Nothing else differs: same SFT warm start (cache key), same optimiser, same task.
    a, b = saa.model_dump(), nosaa.model_dump()
    a["reward"].pop("shapers"), b["reward"].pop("shapers")
    assert a == b


def docpo_run(tmp_path: Path, *extra: str, steps: int = 2):
    overrides = [  # tests/run_configs.py's small run, on the docparse task
        f"train.output_dir={tmp_path}",
        f"train.steps={steps}",
        "train.num_threads=1",
        "train.loggers=[jsonl]",
        "train.progress=false",
        "train.plot=false",
        "rollout.group_size=4",
        "optim.lr=0.001",
        "algorithm.name=docpo",
        "task.name=docparse",
        "task.options={train_size: 60, eval_size: 6}",
        "reward.functions=[{name: docparse}]",
        "reward.correct_threshold=0.99",
        "rollout.prompts_per_step=6",
        "rollout.max_new_tokens=24",
        "eval.size=6",
        *extra,
    ]
    return Trainer(load_config(overrides=overrides))


def records(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_steps_log_per_type_metrics_and_gamma_follows_the_step(tmp_path):
    # Without the group filter every type of the sampled rows reaches the shaper.
    trainer = docpo_run(tmp_path, "algorithm.group_filter=null")
    trainer.train()
    held_out = trainer.evaluate(samples=2)
    trainer.close()
    first, second = records(tmp_path)
    logged = {k.split("/")[1] for r in (first, second) for k in r if k.startswith("docpo/")}
    assert logged == TYPES
    for t in TYPES:
        for r, step in ((first, 0), (second, 1)):
            if f"docpo/{t}/raw_mean" not in r:
                continue
            raw, shaped = r[f"docpo/{t}/raw_mean"], r[f"docpo/{t}/shaped_mean"]
            assert 0.0 <= shaped <= raw <= 1.0  # M ** gamma <= M for gamma >= 1
            assert r[f"docpo/{t}/gamma"] == pytest.approx(
                step_aware_gamma(step, r[f"docpo/{t}/tau"])
            )
            if step == 0:  # gamma(0) = 1: shaping is the identity
                assert shaped == pytest.approx(raw)
    assert "reward/docparse" in first and 0.0 <= first["reward/docparse"] <= 1.0
    # Evaluation scores with the task's verifier: the untrained model is never perfect.
    assert held_out["eval/accuracy"] == 0.0
    assert {"eval/pass@1", "eval/pass@2", "eval/maj@2"} <= set(held_out)


def test_group_filter_drops_all_zero_groups(tmp_path):
    # The untrained model writes no `<table>` and no parseable LaTeX: those groups score all
    # zero and the docpo filter drops them. Shaping runs before the filter (DESIGN's order),
    # so the shaper's per-type metrics cover every sampled type, the dropped ones at 0.
    trainer = docpo_run(tmp_path, steps=1)
    trainer.train()
    trainer.close()
    (record,) = records(tmp_path)
    assert record["filter/kept_groups"] < record["filter/sampled_groups"] == 6
    types = {k.split("/")[1] for k in record if k.startswith("docpo/")}
    assert {"table", "formula"} <= types
    for t in types - {"text"}:
        assert record[f"docpo/{t}/raw_mean"] == record[f"docpo/{t}/shaped_mean"] == 0.0
    assert math.isfinite(record["reward/mean"])
