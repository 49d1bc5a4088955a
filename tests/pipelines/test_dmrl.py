"""`policyopt quickstart dmrl` end to end at a tiny size: summary keys and their meaning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policyopt.envs.ads.adsim.history import burn_in
from policyopt.envs.ads.skilldoc.document import parse_document
from policyopt.envs.ads.skilldoc.rule_agent import RuleAgent
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT
from policyopt.pipelines.dmrl import (
    check_token_budget,
    platform_for,
    proposal_summary,
    run_dmrl_pipeline,
)
from policyopt.recipes import recipe_config
from run_configs import dmrl_tiny_overrides

TINY = dmrl_tiny_overrides(days=2)


def test_a_budget_that_cuts_edits_is_refused_before_training(tmp_path):
    config = recipe_config("dmrl", [*TINY, "rollout.max_new_tokens=40"], str(tmp_path), None)
    with pytest.raises(ValueError, match="max_new_tokens=40 cannot hold the longest"):
        run_dmrl_pipeline(config)
    assert not (tmp_path / "lrp").exists()


def test_proposal_summary_by_hand():
    log = [
        {
            "proposals": 4,
            "ok": 2,
            "malformed": 1,
            "truncated": 1,
            "true_lift": 0.02,
            "random_true_lift": 0.01,
        },
        {
            "proposals": 4,
            "ok": 4,
            "malformed": 0,
            "truncated": 0,
            "true_lift": -0.01,
            "random_true_lift": 0.03,
        },
    ]
    s = proposal_summary(log, last=1)
    assert s == {
        "proposal_true_lift": -0.01,
        "random_proposal_true_lift": 0.03,
        "truncated_fraction": 1 / 8,
        "malformed_fraction": 1 / 8,
    }
    assert proposal_summary(log)["proposal_true_lift"] == pytest.approx(0.005)


@pytest.mark.slow
def test_quickstart_dmrl_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    config = recipe_config("dmrl", TINY, str(out), None)
    summary = run_dmrl_pipeline(config)
    saved = json.loads((out / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    # the task's world (live by default): the population the history left, then a snapshot
    platform = platform_for(config.task.options)
    burn_in(platform, int(saved["lrp"]["first_online_day"]))
    assert platform.world == "live" and saved["world"] == "live"
    users = platform.eval_users(100)
    start = platform.value(RuleAgent()(START_DOCUMENT), users)
    assert saved["initial_long_term_value"] == pytest.approx(start)
    # the final value is the deployed document's, recomputed independently
    final = platform.value(RuleAgent()(parse_document(saved["final_document"])), users)
    assert saved["final_long_term_value"] == pytest.approx(final)
    if saved["deployments"] == 0:
        assert saved["final_document"] == START_DOCUMENT.render()
    assert saved["rl_steps"] == 2 and (out / "lrp" / "lrp.safetensors").is_file()
    days = [json.loads(line) for line in (out / "dmrl_days.jsonl").read_text().splitlines()]
    assert len(days) == 2
    for d in days:  # 4 proposals a day, each counted once by status
        assert d["proposals"] == 4 == d["ok"] + d["malformed"] + d["truncated"]
        assert np.isfinite(d["true_lift"]) and np.isfinite(d["random_true_lift"])
    assert saved["truncated_fraction"] == pytest.approx(sum(d["truncated"] for d in days) / 8)
    assert saved["malformed_fraction"] == pytest.approx(sum(d["malformed"] for d in days) / 8)
    # the recipe decodes under the edit grammar: an edit can be cut, never malformed
    assert config.rollout.engine_options == {"grammar": "skill_rule"}
    assert saved["malformed_fraction"] == 0
    assert saved["edit_token_budget"] == 57 == config.rollout.max_new_tokens


def test_the_budget_check_reads_a_named_models_tokenizer():
    """`model.name_or_path=smollm2` (the SmolLM2 editor): the budget check loads its
    tokenizer through the project's loader, not as a Hub name (it raised OSError)."""
    from policyopt.pipelines.dmrl import _tokenizer_for

    config = recipe_config("dmrl", ["model.name_or_path=smollm2"], None, 0)
    tok = _tokenizer_for(config)
    assert len(tok) == 49152
    # BPE: far fewer tokens than the character model's budget for the same edits
    assert check_token_budget(57, tok, 8) < 57


@pytest.mark.slow
def test_the_smollm2_editor_recipe_runs_with_lora_and_the_grammar(tmp_path, monkeypatch):
    """`policyopt quickstart dmrl_smollm2` at a tiny size: SmolLM2-135M-Instruct with a LoRA
    adapter, its chat template, the edit grammar over its BPE vocabulary."""
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    small = [o for o in TINY if not o.startswith(("sft.steps", "rollout.group_size"))]
    config = recipe_config(
        "dmrl_smollm2",
        [*small, "sft.steps=1", "sft.batch_size=2", "rollout.group_size=2"],
        str(out),
        None,
    )
    assert config.model.lora.enabled and config.model.chat_template
    saved = run_dmrl_pipeline(config)
    assert saved["rl_steps"] == 2
    assert saved["malformed_fraction"] == 0  # the grammar found the document in the template
    # the budget is the BPE tokenizer's (the character model needs 57)
    assert saved["edit_token_budget"] < 57
    # the adapter was trained and saved, the base weights were not
    assert list(out.glob("**/adapter_model.safetensors"))


def test_the_episode_recipe_is_the_dmrl_recipe_with_the_editor_as_an_episode():
    from policyopt.envs.ads.episode import EDITOR, episode_token_budget
    from policyopt.models.tiny import build_char_tokenizer
    from policyopt.pipelines.dmrl import episode_turns

    one, episode = recipe_config("dmrl", [], None, 0), recipe_config("dmrl_episode", [], None, 0)
    assert episode_turns(one) is None and episode_turns(episode) == 3
    assert episode.rollout.strategy == "multi_turn"
    assert episode.rollout.strategy_options == {"environment": EDITOR, "max_turns": 3}
    assert episode.rollout.engine_options == {"grammar": None}
    # the budget is the episode's, exactly; nothing else of the recipe moves (the task
    # options, hence the SFT warm start's and the LRP's cache keys, included)
    budget = episode_token_budget(build_char_tokenizer(), 3, 8)
    assert episode.rollout.max_new_tokens == budget == 195
    assert check_token_budget(budget, build_char_tokenizer(), 8, 3) == budget
    with pytest.raises(ValueError, match="cannot hold 3 of the longest demonstration edits"):
        check_token_budget(budget - 1, build_char_tokenizer(), 8, 3)
    assert episode.task == one.task and episode.sft == one.sft
    assert episode.algorithm == one.algorithm and episode.model == one.model


def test_episodes_under_the_edit_grammar_are_refused_before_training(tmp_path):
    config = recipe_config(
        "dmrl_episode",
        [*TINY, 'rollout.engine_options={"grammar": "skill_rule"}'],
        str(tmp_path),
        None,
    )
    with pytest.raises(ValueError, match="cannot decode under the edit grammar"):
        run_dmrl_pipeline(config)
    assert not (tmp_path / "lrp").exists()


@pytest.mark.slow
def test_quickstart_dmrl_episode_tiny(tmp_path, monkeypatch):
    """`policyopt quickstart dmrl_episode` at a tiny size: episodes of up to 3 edits, the
    day records per episode and per turn, the deployed document still the true one."""
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    config = recipe_config("dmrl_episode", TINY, str(out), None)
    saved = run_dmrl_pipeline(config)
    assert saved["rl_steps"] == 2 and saved["episode_turns"] == 3
    assert saved["edit_token_budget"] == 195 == config.rollout.max_new_tokens
    days = [json.loads(line) for line in (out / "dmrl_days.jsonl").read_text().splitlines()]
    assert len(days) == 2
    for d in days:  # 4 episodes a day of 3 turns each, unless the budget cut one
        assert d["proposals"] == 4 and 4 <= d["turns"] <= 12
        assert d["turns"] == d["ok"] + d["malformed"] + d["truncated"]
        assert np.isfinite(d["true_lift"]) and np.isfinite(d["random_true_lift"])
    turns = sum(d["turns"] for d in days)
    assert saved["malformed_fraction"] == pytest.approx(sum(d["malformed"] for d in days) / turns)
    platform = platform_for(config.task.options)
    burn_in(platform, int(saved["lrp"]["first_online_day"]))
    final = platform.value(
        RuleAgent()(parse_document(saved["final_document"])), platform.eval_users(100)
    )
    assert saved["final_long_term_value"] == pytest.approx(final)
