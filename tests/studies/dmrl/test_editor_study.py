"""The DMRL editor study (`recipes/dmrl_editor_study.py`) at a tiny size: the arms' configs,
the random-edit arm, and the report's paired numbers recomputed from the day records."""

from __future__ import annotations

import json

import numpy as np
import pytest
from studies.dmrl.ablation import VARIANTS
from studies.dmrl.editor_study import (
    FROZEN_LR,
    arm_overrides,
    report,
    run_arm,
    search_value,
    table,
)

from policyopt.envs.ads.skilldoc.document import parse_document
from policyopt.recipes import recipe_config
from run_configs import dmrl_tiny_overrides

STUDY = dmrl_tiny_overrides(days=3)


def test_the_sft_arm_is_drpo_with_the_update_off():
    cfg = recipe_config("dmrl", arm_overrides("sft"), None, 0)
    drpo = recipe_config("dmrl", arm_overrides("drpo"), None, 0)
    assert cfg.optim.lr == FROZEN_LR
    assert cfg.algorithm.advantage_options == drpo.algorithm.advantage_options
    assert drpo.optim.lr == recipe_config("dmrl", [], None, 0).optim.lr
    grpo = recipe_config("dmrl", arm_overrides("grpo"), None, 0)
    assert grpo.algorithm.advantage == VARIANTS["grpo"]["algorithm.advantage"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("editor_study")
    for seed in (0, 1):
        search_value(recipe_config("dmrl", STUDY, None, seed), out, 20)
        for arm in ("random", "sft"):
            run_arm(arm, seed, out, STUDY)
    return out, report(out, [0, 1], ["random", "sft"], 20)


def _days(out, arm, seed):
    return [json.loads(x) for x in (out / arm / f"seed{seed}" / "dmrl_days.jsonl").open()]


@pytest.mark.slow
def test_the_random_arm_proposes_well_formed_edits_every_day(study):
    out, _ = study
    for seed in (0, 1):
        log = _days(out, "random", seed)
        assert len(log) == 3  # train.steps days
        assert all(r["proposals"] == 4 and r["ok"] == 4 for r in log)
        summary = json.loads((out / "random" / f"seed{seed}" / "summary.json").read_text())
        assert summary["malformed_fraction"] == summary["truncated_fraction"] == 0.0
        parse_document(summary["final_document"])  # the deployed document is well formed


def test_the_report_is_the_day_records_by_hand(study):
    out, result = study
    sft, rnd = result["arms"]["sft"], result["arms"]["random"]
    assert sft["seeds"] == rnd["seeds"] == [0, 1]
    diffs = []
    for seed in (0, 1):
        lift_sft = np.mean([r["true_lift"] for r in _days(out, "sft", seed)])
        lift_rnd = np.mean([r["true_lift"] for r in _days(out, "random", seed)])
        diffs.append(lift_sft - lift_rnd)
        paired = np.mean([r["true_lift"] - r["random_true_lift"] for r in _days(out, "sft", seed)])
        assert sft["per_seed"][seed]["vs_random_all"] == pytest.approx(paired)
        # the second half of the run's days (here days 1-2 of 0-2; of 60, days 30-59)
        late = [r["true_lift"] - r["random_true_lift"] for r in _days(out, "sft", seed)[1:]]
        assert sft["per_seed"][seed]["vs_random_half"] == pytest.approx(np.mean(late))
        search = json.loads((out / "search" / f"seed{seed}_b20.json").read_text())
        summary = json.loads((out / "sft" / f"seed{seed}" / "summary.json").read_text())
        row = sft["per_seed"][seed]
        assert row["regret"] == pytest.approx(
            1 - summary["final_long_term_value"] / search["value"]
        )
        assert search["evaluations"] <= 20
    stat = sft["stats"]["lift_all_minus_random"]
    assert stat["per_seed"] == pytest.approx(diffs)
    assert stat["mean"] == pytest.approx(np.mean(diffs))
    half = 12.706 * np.std(diffs, ddof=1) / np.sqrt(2)  # t(0.975, 1 df)
    assert stat["ci95"] == pytest.approx(half, rel=1e-3)
    assert "| sft | 2 |" in table(result)
    assert len(result["curves"]["sft"]) == 3


def test_the_episode_and_no_grammar_arms_are_drpo_with_one_thing_changed():
    from studies.dmrl.editor_study import arm_recipe, paired_bases

    drpo = recipe_config("dmrl", arm_overrides("drpo"), None, 0)
    episode = recipe_config(
        arm_recipe("drpo_episode", "dmrl"), arm_overrides("drpo_episode"), None, 0
    )
    free = recipe_config(arm_recipe("drpo_free", "dmrl"), arm_overrides("drpo_free"), None, 0)
    assert arm_recipe("drpo_episode", "dmrl") == "dmrl_episode"
    assert episode.algorithm == drpo.algorithm == free.algorithm
    assert episode.rollout.strategy == "multi_turn" and drpo.rollout.strategy == "parallel"
    assert free.rollout.engine_options == {"grammar": None}
    assert drpo.rollout.engine_options == {"grammar": "skill_rule"}
    assert free.rollout.model_copy(update={"engine_options": {}}) == drpo.rollout.model_copy(
        update={"engine_options": {}}
    )
    assert episode.task == drpo.task and episode.sft == drpo.sft  # the same caches
    assert paired_bases("drpo_episode") == ["random", "sft", "drpo", "drpo_free"]
    assert paired_bases("drpo_free") == ["random", "sft", "drpo"]
    with pytest.raises(ValueError, match="needs the episode recipe"):
        arm_recipe("drpo_episode", "dmrl_smollm2")


@pytest.mark.slow
def test_the_episode_arm_runs_beside_the_others(study):
    out, _ = study
    for seed in (0, 1):
        run_arm("drpo_episode", seed, out, STUDY)
    result = report(out, [0, 1], ["random", "sft", "drpo_episode"], 20)
    episode = result["arms"]["drpo_episode"]
    assert episode["seeds"] == [0, 1]
    diffs = []
    for seed in (0, 1):
        log = _days(out, "drpo_episode", seed)
        assert len(log) == 3 and all(r["proposals"] == 4 for r in log)
        # the paired random baseline: random edit sequences from the same states
        paired = np.mean([r["true_lift"] - r["random_true_lift"] for r in log])
        assert episode["per_seed"][seed]["vs_random_all"] == pytest.approx(paired)
        sft = np.mean([r["true_lift"] - r["random_true_lift"] for r in _days(out, "sft", seed)])
        diffs.append(paired - sft)
        summary = json.loads((out / "drpo_episode" / f"seed{seed}" / "summary.json").read_text())
        assert summary["episode_turns"] == 3
    assert episode["stats"]["vs_random_all_minus_sft"]["per_seed"] == pytest.approx(diffs)
    assert "| drpo_episode | 2 |" in table(result)
