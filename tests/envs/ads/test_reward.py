"""The dmrl_lrp reward function on a live environment, and its structure reaching drpo."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policyopt.core import compute_advantages
from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import make_history
from policyopt.envs.ads.lrp.features import build_bank
from policyopt.envs.ads.lrp.io import load_lrp, save_lrp
from policyopt.envs.ads.lrp.train import LRPTrainConfig, train_lrp
from policyopt.envs.ads.reward import LRPReward, lift_rewards
from policyopt.envs.ads.skilldoc.document import parse_edit
from policyopt.rewards.functions import build_reward_pipeline
from policyopt.tasks.base import get_task


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
    "replace ads 1: keep ad load low\n",
    "garbage that is no edit\n",
    "replace ads 1: keep ad load low\n",  # a duplicate shares the arm
    "delete budget 1\n",
    "insert ranking: set quality weight high\n",
    "replace ads 9: keep ad load low\n",  # no rule 9: malformed
    "replace ranking 1: set quality weight hi",  # no line end: truncated, never applied
]


def test_scoring_leaves_the_world_and_the_round_ends_the_day(lrp_dir):
    """The reward scores the day's proposals and changes nothing of the world; the task
    ends the day (deploys, logs) when the step's round ends (`Task.end_of_round`)."""
    task = live_task(lrp_dir)
    env = task.env
    n = len(COMPLETIONS)
    before = (env.day, env.document.render(), list(env.recent), len(env.log))
    out = LRPReward(task)(["p"] * n, COMPLETIONS)
    assert (env.day, env.document.render(), list(env.recent), len(env.log)) == before
    again = LRPReward(task)(["p"] * n, COMPLETIONS)  # the same world scores the same
    assert again.rewards == out.rewards
    task.end_of_round()
    r, s = out.rewards, out.structure
    r0 = float(s["control_rewards"][0])
    assert (s["control_rewards"] == r0).all() and r0 > 0  # one control for the group
    for i in (1, 5, 6):  # malformed and truncated: "no change" minus the 1% penalty
        assert r[i] == pytest.approx(r0 * (1 - env.invalid_penalty))
    assert r[0] == r[2] and len({r[0], r[3], r[4]}) == 3
    assert s["edit_costs"].shape == (n,) and s["edit_costs"][1] == 0 and s["edit_costs"][0] > 0
    assert s["edit_costs"][0] == s["edit_costs"][2] and s["edit_costs"][6] == 0
    assert env.day == 1 and len(env.recent) == 1 and len(env.recent[0].pop_lifts) == 4
    rec = env.log[-1]
    assert (rec["ok"], rec["malformed"], rec["truncated"]) == (4, 2, 1)
    lifts = [r[i] / r0 - 1 for i in (0, 3, 4)]
    # deployed exactly when the best predicted lift clears the margin (not merely > 0)
    assert (len(env.deployed_days) == 1) == (max(lifts) > env.deploy_margin) == rec["deployed"]
    assert np.isfinite(rec["true_lift"]) and np.isfinite(rec["random_true_lift"])


def test_lift_rewards_by_hand():
    # control per population (10, 20, 10, 20), shares (.5, .25, .125, .125): R0 = 13.75.
    # arm 0 raises population 0 to 11: 14.25, lift 0.5/13.75; arm 1 lowers population 1 to 16:
    # 12.75, lift -1/13.75. An invalid row scores 13.75 * (1 - 0.02) = 13.475.
    control = [10.0, 20.0, 10.0, 20.0]
    pv = np.array([[control, [11.0, 20.0, 10.0, 20.0]], [control, [10.0, 16.0, 10.0, 20.0]]])
    w = np.array([0.5, 0.25, 0.125, 0.125])
    rewards, r0, lifts = lift_rewards(pv, w, [0, None, 1, 0], penalty=0.02)
    assert r0 == pytest.approx(13.75)
    np.testing.assert_allclose(lifts, [0.5 / 13.75, -1 / 13.75])
    assert rewards == pytest.approx([14.25, 13.475, 12.75, 14.25])
    # DRPO's control term is the lift; its group term is the robust z-score of the lifts
    rt = torch.tensor(rewards, dtype=torch.float64)
    adv = compute_advantages(
        "drpo",
        rt,
        torch.zeros(4, dtype=torch.long),
        control_rewards=torch.full((4,), r0, dtype=torch.float64),
        edit_costs=torch.zeros(4, dtype=torch.float64),
        alpha=0.0,
    )
    np.testing.assert_allclose(adv.numpy(), [0.5 / 13.75, -0.02, -1 / 13.75, 0.5 / 13.75])
    # median of the lifts (-0.02 and 0.03636 in the middle) = 0.008182; MAD = 0.028182
    lift = np.array([0.5 / 13.75, -0.02, -1 / 13.75, 0.5 / 13.75])
    med = np.median(lift)
    mad = np.median(np.abs(lift - med))
    robust = compute_advantages(
        "drpo",
        rt,
        torch.zeros(4, dtype=torch.long),
        control_rewards=torch.full((4,), r0, dtype=torch.float64),
        edit_costs=torch.zeros(4, dtype=torch.float64),
        alpha=1.0,
        delta=0.0,
    )
    np.testing.assert_allclose(robust.numpy(), (lift - med) / (1.4826 * mad), rtol=1e-9)


def test_all_malformed_still_gives_structure(lrp_dir):
    task = live_task(lrp_dir)
    out = LRPReward(task)(["p", "p"], ["x\n", "y"])
    task.end_of_round()
    r0 = float(out.structure["control_rewards"][0])
    assert out.rewards == pytest.approx([r0 * 0.99, r0 * 0.99])
    assert out.structure["edit_costs"].tolist() == [0.0, 0.0]
    assert task.env.day == 1 and not task.env.deployed_days
    assert (task.env.log[-1]["malformed"], task.env.log[-1]["truncated"]) == (1, 1)


def test_pipeline_hands_structure_to_drpo(lrp_dir):
    task = live_task(lrp_dir)
    pipe = build_reward_pipeline([("dmrl_lrp", 1.0)], task)
    n = len(COMPLETIONS)
    result = pipe(["p"] * n, COMPLETIONS, {"doc": [""] * n})
    assert result.unparseable["dmrl_lrp"] == 0  # invalid edits score, counted in env.log
    adv = compute_advantages(
        "drpo", result.total, torch.zeros(n, dtype=torch.long), **result.structure
    )
    assert adv.shape == (n,) and torch.isfinite(adv).all()


def test_missing_lrp_is_a_clear_error():
    task = get_task("dmrl_skill", users_per_arm=40, eval_users=50)
    with pytest.raises(ValueError, match="no trained LRP"):
        LRPReward(task)(["p"], ["delete ads 1\n"])


def test_the_reward_needs_a_live_world():
    with pytest.raises(ValueError, match="dmrl_lrp scores the edits of a live dmrl_skill task"):
        build_reward_pipeline([("dmrl_lrp", 1.0)], get_task("arithmetic"))


def test_a_round_without_scoring_passes_no_day(lrp_dir):
    task = live_task(lrp_dir)
    task.end_of_round()
    assert task.env.day == 0 and task.env.log == []


def test_verify_is_the_true_relative_lift(lrp_dir):
    task = live_task(lrp_dir)
    row = task.rows("train")[0]
    assert task.verify("nonsense\n", row) is None
    assert task.verify("replace ads 1: keep ad load low", row) is None  # truncated
    lift = task.verify("replace ads 1: keep ad load low\n", row)
    new = task.env.document.apply(parse_edit("replace ads 1: keep ad load low", task.env.document))
    assert lift == pytest.approx(task.value(new) / task.value(task.env.document) - 1)


@pytest.mark.slow
def test_scripted_deployment_loop_runs(lrp_dir):
    from studies.dmrl.scripted import climb

    rows = climb(str(lrp_dir), seed=0, days=2, edits=4)
    assert rows[-1][0] == 2 and 0 <= rows[-1][2] <= 2
