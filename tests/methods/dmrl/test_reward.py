"""The dmrl_lrp reward function on a live environment, and its structure reaching drpo."""

from __future__ import annotations

import pytest
import torch

from policyopt.core import compute_advantages
from policyopt.methods.dmrl.lrp_features import build_bank
from policyopt.methods.dmrl.lrp_io import load_lrp, save_lrp
from policyopt.methods.dmrl.lrp_train import LRPTrainConfig, train_lrp
from policyopt.methods.dmrl.reward import dmrl_lrp_reward
from policyopt.rewards.functions import build_reward_pipeline
from policyopt.tasks.adsim.abtest import AdPlatform
from policyopt.tasks.adsim.history import make_history
from policyopt.tasks.base import get_task
from policyopt.tasks.skilldoc.document import parse_edit


@pytest.fixture(scope="module")
def lrp_dir(tmp_path_factory):
    history = make_history(AdPlatform(seed=0, users_per_arm=60), 16, per_day=2)
    model, _ = train_lrp(
        history, LRPTrainConfig(hidden=8, warmup_epochs=5, disc_epochs=2, joint_epochs=2)
    )
    path = tmp_path_factory.mktemp("lrp")
    save_lrp(path, model, build_bank(history, float(model.y_mean), float(model.y_std)))
    return path


def test_lrp_round_trips(lrp_dir):
    model, bank = load_lrp(lrp_dir)
    assert len(bank) == 16 * 4 and not any(p.requires_grad for p in model.parameters())
    with pytest.raises(FileNotFoundError, match="no trained LRP"):
        load_lrp(lrp_dir / "missing")


def live_task(lrp_dir):
    return get_task(
        "dmrl_skill", users_per_arm=60, first_day=8, lrp_path=str(lrp_dir), eval_users=200
    )


COMPLETIONS = [
    "replace ads 1: keep ad load low",
    "garbage that is no edit",
    "replace ads 1: keep ad load low",  # a duplicate shares the A/B test
    "delete budget 1",
    "insert ranking: set quality weight high",
    "replace ads 9: keep ad load low",  # no rule 9
]


def test_rewards_structure_and_one_day_per_call(lrp_dir):
    task = live_task(lrp_dir)
    env = task.env
    key = [task.env_key] * len(COMPLETIONS)
    out = dmrl_lrp_reward(["p"] * len(COMPLETIONS), COMPLETIONS, env_key=key)
    r, s = out.rewards, out.structure
    assert r[1] is None and r[5] is None
    assert r[0] == r[2] and all(isinstance(r[i], float) for i in (0, 3, 4))
    assert s["edit_costs"].shape == (6,) and s["edit_costs"][1] == 0 and s["edit_costs"][0] > 0
    assert s["edit_costs"][0] == s["edit_costs"][2]
    assert len(s["control_rewards"]) == 6 and all(c > 0 for c in s["control_rewards"])
    assert env.day == 1 and len(env.recent) == 1
    lifts = [r[i] / s["control_rewards"][i] - 1 for i in (0, 3, 4)]
    assert (len(env.deployed_days) == 1) == (max(lifts) > 0)


def test_all_malformed_still_gives_structure(lrp_dir):
    task = live_task(lrp_dir)
    out = dmrl_lrp_reward(["p", "p"], ["x", "y"], env_key=[task.env_key] * 2)
    assert out.rewards == [None, None]
    assert out.structure["edit_costs"].tolist() == [0.0, 0.0]
    assert task.env.day == 1 and not task.env.deployed_days


def test_pipeline_hands_structure_to_drpo(lrp_dir):
    task = live_task(lrp_dir)
    pipe = build_reward_pipeline([("dmrl_lrp", 1.0)], task)
    n = len(COMPLETIONS)
    result = pipe(["p"] * n, COMPLETIONS, {"env_key": [task.env_key] * n})
    assert result.unparseable["dmrl_lrp"] == 2
    adv = compute_advantages(
        "drpo", result.total, torch.zeros(n, dtype=torch.long), **result.structure
    )
    assert adv.shape == (n,) and torch.isfinite(adv).all()


def test_missing_lrp_is_a_clear_error():
    task = get_task("dmrl_skill", users_per_arm=40, eval_users=50)
    with pytest.raises(ValueError, match="no trained LRP"):
        dmrl_lrp_reward(["p"], ["delete ads 1"], env_key=[task.env_key])


def test_verify_is_the_true_relative_lift(lrp_dir):
    task = live_task(lrp_dir)
    row = task.rows("train")[0]
    assert task.verify("nonsense", row) is None
    lift = task.verify("replace ads 1: keep ad load low", row)
    new = task.env.document.apply(parse_edit("replace ads 1: keep ad load low", task.env.document))
    assert lift == pytest.approx(task.value(new) / task.value(task.env.document) - 1)


def test_scripted_deployment_loop_runs(lrp_dir):
    from policyopt.recipes.dmrl_scripted import climb

    rows = climb(str(lrp_dir), seed=0, days=2, edits=4)
    assert rows[-1][0] == 2 and 0 <= rows[-1][2] <= 2
