"""The predictor study's baselines (`recipes/dmrl_predictors.py`) fit and score on a small
history: gradient boosting and the MLP on the LRP's own rows, effects formed as the LRP's."""

from __future__ import annotations

import numpy as np
import pytest
from studies.dmrl.predictors import baseline_effects, lrp_variants

from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import make_history


@pytest.fixture(scope="module")
def split():
    history = make_history(AdPlatform(seed=0, users_per_arm=60), 40, per_day=4)
    return history[:32], history[32:]


def test_gbm_and_mlp_baselines_fit_and_score(split):
    train, held = split
    out = baseline_effects(train, held, seed=0)
    assert set(out) == {"gbm", "mlp", "surrogate"}
    for name, metrics in out.items():
        assert np.isfinite(metrics["spearman"]) and metrics["mse"] >= 0, name


def test_the_lrp_ablations_are_the_ones_the_table_names():
    names = [name for name, _ in lrp_variants({"hidden": 8})]
    assert names == ["lrp", "lrp_no_adversary", "lrp_no_bank", "lrp_sum_fusion"]
    cfg = dict(lrp_variants({"hidden": 8}))
    assert cfg["lrp_no_adversary"].adv_lambda == 0 and cfg["lrp"].adv_lambda > 0
    assert not cfg["lrp_no_bank"].use_bank and cfg["lrp_sum_fusion"].fusion == "sum"
    assert cfg["lrp"].fusion == "gated"
