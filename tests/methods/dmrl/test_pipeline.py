"""`policyopt quickstart dmrl` end to end at a tiny size: summary keys and their meaning."""

from __future__ import annotations

import json

import pytest

from policyopt.recipes import recipe_config
from policyopt.recipes.dmrl_pipeline import run_dmrl_pipeline
from policyopt.tasks.adsim.abtest import AdPlatform
from policyopt.tasks.skilldoc.rule_agent import RuleAgent
from policyopt.tasks.skilldoc.scripted import START_DOCUMENT


@pytest.mark.slow
def test_quickstart_dmrl_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    config = recipe_config(
        "dmrl",
        [
            "task.options.history=24",
            "task.options.users_per_arm=50",
            "task.options.eval_users=100",
            "task.options.lrp={hidden: 8, warmup_epochs: 5, disc_epochs: 2, joint_epochs: 2}",
            "sft.steps=2",
            "rollout.group_size=4",
            "rollout.prompts_per_step=1",
            "rollout.max_new_tokens=16",
            "train.steps=2",
            "train.progress=false",
            "train.plot=false",
        ],
        str(out),
        None,
    )
    summary = run_dmrl_pipeline(config)
    saved = json.loads((out / "summary.json").read_text())
    for key in (
        "initial_long_term_value",
        "final_long_term_value",
        "lrp_spearman",
        "surrogate_spearman",
    ):
        assert saved[key] == pytest.approx(summary[key])
    platform = AdPlatform(0, users_per_arm=50)
    start = platform.value(RuleAgent()(START_DOCUMENT), platform.eval_users(100))
    assert saved["initial_long_term_value"] == pytest.approx(start)
    assert saved["rl_steps"] == 2 and (out / "lrp" / "lrp.safetensors").is_file()
