"""The LRP against baselines on the same inputs, and ablated, over seeds.

    python -m studies.dmrl.predictors [--seeds 0 1 2] [--history 400]
        [--out runs/dmrl_predictors]

Per seed: the `dmrl` recipe's offline history (`task.options.history` experiments, 4 a
day), the first 80% by day for training, the last 20% held out, as the quickstart does.
Each predictor gives each held-out experiment's 7-day effect (treatment − control value per
user); Spearman and MSE against the true effect (`evaluate_effects`). Predictors:

- `lrp`: the recipe's LRP; `lrp_no_adversary`: λ_adv = 0; `lrp_no_bank`: trained and
  used with an empty memory bank; `lrp_sum_fusion`: the fusion's gate removed;
- `gbm`: LightGBM regression of each (experiment, arm, population) row's 7-day value on the
  LRP's own inputs [x_agn, x_spe] (42 features), effects formed as the LRP's are;
- `mlp`: a plain MLP (scikit-learn, two hidden layers of 64) on the same rows;
- `surrogate`: the surrogate index on the 5 aggregate day-1 deltas.
Writes `<out>/predictors.json` and prints a markdown table (mean ± 95% t-interval over seeds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightgbm import LGBMRegressor
from sklearn.neural_network import MLPRegressor

from policyopt.core.stats import mean_ci
from policyopt.envs.ads.adsim.abtest import POPS, Experiment
from policyopt.envs.ads.adsim.history import make_history
from policyopt.envs.ads.lrp.features import MemoryBank, build_bank, build_samples
from policyopt.envs.ads.lrp.surrogate import SurrogateIndex
from policyopt.envs.ads.lrp.train import (
    LRPTrainConfig,
    evaluate_effects,
    predicted_arm_values,
    train_lrp,
)
from policyopt.pipelines.dmrl import PER_DAY, TRAIN_SHARE, platform_for
from policyopt.recipes import recipe_config


def _rows(experiments: list[Experiment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = build_samples(experiments)
    return torch.cat([s.x_agn, s.x_spe], 1).numpy(), s.y.numpy(), s.weight.numpy()


def _effects(pred_rows: np.ndarray, weight: np.ndarray) -> np.ndarray:
    v = (pred_rows * weight).reshape(-1, 2, POPS).sum(-1)
    return v[:, 1] - v[:, 0]


def lrp_variants(lrp_options: dict[str, Any], seed: int = 0) -> list[tuple[str, LRPTrainConfig]]:
    """The LRP and its ablations: λ_adv = 0; an empty memory bank; the gate of the fusion
    removed (z = z_agn + z_spe + z_trans)."""
    base = LRPTrainConfig(**{"seed": seed, **lrp_options})
    return [
        ("lrp", base),
        ("lrp_no_adversary", dataclasses.replace(base, adv_lambda=0.0)),
        ("lrp_no_bank", dataclasses.replace(base, use_bank=False)),
        ("lrp_sum_fusion", dataclasses.replace(base, fusion="sum")),
    ]


def baseline_effects(
    train: list[Experiment], held: list[Experiment], seed: int
) -> dict[str, dict[str, float]]:
    """GBM and MLP on the LRP's own rows, and the surrogate index: held-out effect metrics."""
    xt, yt, _ = _rows(train)
    xh, _, wh = _rows(held)
    mu, sd = xt.mean(0), xt.std(0) + 1e-6
    gbm = LGBMRegressor(n_estimators=300, learning_rate=0.05, num_leaves=15, verbose=-1)
    gbm.fit(xt, yt)
    out = {"gbm": evaluate_effects(_effects(gbm.predict(xh), wh), held)}
    ym, ys = yt.mean(), yt.std()
    # keyword: scikit-learn's first positional parameter is `loss`, not the layer sizes
    mlp = MLPRegressor(
        hidden_layer_sizes=(64, 64), max_iter=600, random_state=seed, early_stopping=True
    )
    mlp.fit((xt - mu) / sd, (yt - ym) / ys)
    out["mlp"] = evaluate_effects(_effects(mlp.predict((xh - mu) / sd) * ys + ym, wh), held)
    out["surrogate"] = evaluate_effects(SurrogateIndex().fit(train).predict(held), held)
    return out


def one_seed(seed: int, history_n: int, lrp_options: dict[str, Any]) -> dict[str, dict]:
    platform = platform_for({"seed": seed, "users_per_arm": 300})  # the task's world
    history = make_history(platform, history_n, PER_DAY, seed)
    cut = int(len(history) * TRAIN_SHARE)
    train, held = history[:cut], history[cut:]
    out: dict[str, dict] = {}
    for name, cfg in lrp_variants(lrp_options, seed):
        model, _ = train_lrp(train, cfg)
        bank = (
            build_bank(history, float(model.y_mean), float(model.y_std))
            if cfg.use_bank
            else MemoryBank.empty()
        )
        v = predicted_arm_values(model, held, bank)
        out[name] = evaluate_effects(v[:, 1] - v[:, 0], held)
    return {**out, **baseline_effects(train, held, seed)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--history", type=int, default=400)
    p.add_argument("--out", default="runs/dmrl_predictors")
    args = p.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lrp_options = dict(recipe_config("dmrl", [], str(out), 0).task.options)["lrp"]
    path = out / "predictors.json"
    done: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for seed in args.seeds:  # resumable: a finished seed is kept
        if str(seed) not in done:
            done[str(seed)] = one_seed(seed, args.history, lrp_options)
            path.write_text(json.dumps(done, indent=2))
    seeds = [str(s) for s in args.seeds]
    print(f"| predictor | Spearman (mean, 95% t-CI; seeds {' '.join(seeds)}) | per seed | MSE |")
    print("|---|---|---|---|")
    for name in done[seeds[0]]:
        sp = [done[s][name]["spearman"] for s in seeds]
        m, half = mean_ci(sp)
        mse = np.mean([done[s][name]["mse"] for s in seeds])
        per = " / ".join(f"{x:.3f}" for x in sp)
        print(f"| {name} | {m:.3f} ± {half:.3f} | {per} | {mse:.4f} |")


if __name__ == "__main__":
    main()
