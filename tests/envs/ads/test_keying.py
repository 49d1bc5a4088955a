"""Each run's reward is bound to its own world, and loads the predictor at that world's path."""

from __future__ import annotations

import pytest

from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import make_history
from policyopt.envs.ads.lrp.features import build_bank
from policyopt.envs.ads.lrp.io import save_lrp
from policyopt.envs.ads.lrp.train import LRPTrainConfig, train_lrp
from policyopt.rewards.functions import build_reward_pipeline
from policyopt.tasks.base import get_task


def _lrp(path, seed):
    history = make_history(AdPlatform(seed=seed, users_per_arm=30), 8, per_day=2)
    cfg = LRPTrainConfig(hidden=4, warmup_epochs=2, disc_epochs=1, joint_epochs=1, seed=seed)
    model, _ = train_lrp(history, cfg)
    save_lrp(path, model, build_bank(history, float(model.y_mean), float(model.y_std)))
    return str(path)


@pytest.mark.slow
def test_two_runs_in_one_process_score_their_own_worlds(tmp_path):
    """No registry between tasks and rewards: two pipelines built in one process hold two
    worlds, each with the predictor at its own lrp_path."""
    a, b = _lrp(tmp_path / "a", 0), _lrp(tmp_path / "b", 1)
    first = get_task("dmrl_skill", users_per_arm=10, eval_users=10, lrp_path=a)
    second = get_task("dmrl_skill", users_per_arm=10, eval_users=10, lrp_path=b)
    fa = build_reward_pipeline([("dmrl_lrp", 1.0)], first).functions[0][1]
    fb = build_reward_pipeline([("dmrl_lrp", 1.0)], second).functions[0][1]
    assert fa.env is first.env and fb.env is second.env
    fa(["p"], ["delete ads 1\n"])
    fb(["p"], ["delete ads 1\n"])
    assert (fa.scorer.path, fb.scorer.path) == (a, b)
    assert fa.scorer.model is not fb.scorer.model
    loaded = fa.scorer
    fa(["p"], ["delete ads 1\n"])
    assert fa.scorer is loaded  # loaded once per path
