"""Runs and predictors are keyed so that two runs in one process cannot share one."""

from __future__ import annotations

import gc

import pytest

from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import make_history
from policyopt.envs.ads.lrp.features import build_bank
from policyopt.envs.ads.lrp.io import save_lrp
from policyopt.envs.ads.lrp.train import LRPTrainConfig, train_lrp
from policyopt.envs.ads.reward import scorer_for
from policyopt.tasks.base import get_task


@pytest.mark.slow
def test_tasks_built_one_after_another_get_distinct_keys():
    # CPython reuses id() once an object is freed: `dmrl-{id(self)}` repeated here.
    keys = []
    for _ in range(8):
        task = get_task("dmrl_skill", users_per_arm=10, eval_users=10)
        keys.append(task.env_key)
        del task
        gc.collect()
    assert len(set(keys)) == len(keys)


def _lrp(path, seed):
    history = make_history(AdPlatform(seed=seed, users_per_arm=30), 8, per_day=2)
    cfg = LRPTrainConfig(hidden=4, warmup_epochs=2, disc_epochs=1, joint_epochs=1, seed=seed)
    model, _ = train_lrp(history, cfg)
    save_lrp(path, model, build_bank(history, float(model.y_mean), float(model.y_std)))
    return str(path)


@pytest.mark.slow
def test_the_scorer_is_the_one_at_the_environments_lrp_path(tmp_path):
    a, b = _lrp(tmp_path / "a", 0), _lrp(tmp_path / "b", 1)
    task = get_task("dmrl_skill", users_per_arm=10, eval_users=10, lrp_path=a)
    first = scorer_for(task.env_key, task.env)
    task.env.lrp_path = b  # a later run with another predictor, same environment key
    second = scorer_for(task.env_key, task.env)
    assert second is not first and second.model is not first.model
    assert (first.path, second.path) == (a, b)
    assert scorer_for(task.env_key, task.env) is second  # loaded once per path
