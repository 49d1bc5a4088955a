"""Does the DMRL reward measure the edit? Noise (one edit tested repeatedly) against spread
(between edits), for the old reward and the new one.

    python -m studies.dmrl.noise [--seed 0] [--edits 8] [--repeats 16]
        [--users 100 300] [--out runs/dmrl_noise]

E distinct well-formed edits of the start document (scripted, distinct configurations) are
each tested R times, on R different days' traffic:

- old: one two-arm A/B test per candidate with its own users; R_i = the LRP's predicted
  value of the treatment arm (what the first version's DRPO ranked);
- new: one multi-arm test per day with every candidate against one control
  (`AdPlatform.multi_arm_test`); the LRP's predicted lift over that control (`dmrl_lrp`).

Both are reported relative to the control's value, so that they share a unit (old: R_i/R0
of the mean control value − 1). noise = mean over edits of the std over repeats; spread =
std over edits of the mean over repeats; also with the simulator's true values on each
test's users (no LRP error). The LRP is the `dmrl` recipe's (cached per seed).
Writes `<out>/noise_seed<seed>.json` and prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policyopt.envs.ads.adsim.history import burn_in
from policyopt.envs.ads.lrp.io import load_lrp
from policyopt.envs.ads.reward import Scorer
from policyopt.envs.ads.skilldoc.env import SkillEnv
from policyopt.envs.ads.skilldoc.rule_agent import RuleAgent
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT, scripted_edit
from policyopt.methods.dmrl.edit_cost import EditCost
from policyopt.pipelines.dmrl import cached_lrp, platform_for
from policyopt.recipes import recipe_config

FIRST_DAY = 100  # the recipe's first online day (400 offline experiments, 4 per day)


def distinct_edits(n: int, seed: int) -> list:
    """n scripted edits of the start document with pairwise distinct configurations."""
    rng, agent = np.random.default_rng([seed, 11]), RuleAgent()
    seen = {tuple(agent(START_DOCUMENT).as_dict().values())}
    out = []
    while len(out) < n:
        e = scripted_edit(START_DOCUMENT, rng)
        key = tuple(agent(START_DOCUMENT.apply(e)).as_dict().values())
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def noise_and_spread(x: np.ndarray) -> dict[str, float]:
    """x [repeats, edits]: noise = mean_e std_r, spread = std_e mean_r (ddof 1), and
    within-day noise: the same after removing each repeat's mean over the edits (a shift
    that every candidate of a day shares does not change their order)."""
    centred = x - x.mean(1, keepdims=True)
    return {
        "noise": float(x.std(0, ddof=1).mean()),
        "within_day_noise": float(centred.std(0, ddof=1).mean()),
        "spread": float(x.mean(0).std(ddof=1)),
    }


def measure(
    options: dict[str, Any], edits: int, repeats: int, users: int, lrp_dir: Path
) -> dict[str, Any]:
    model, bank = load_lrp(lrp_dir)
    seed = int(options["seed"])
    # the recipe's world; live: the population the history left, living one day per repeat
    platform = platform_for({**options, "users_per_arm": users})
    burn_in(platform, FIRST_DAY)
    env = SkillEnv(platform, first_day=FIRST_DAY)
    scorer = Scorer(str(lrp_dir), model, bank, EditCost())
    cands = [START_DOCUMENT.apply(e) for e in distinct_edits(edits, seed)]
    control = env.control
    configs = [env.agent(c) for c in cands]
    old_pred, old_true, new_pred, new_true = (np.zeros((repeats, edits)) for _ in range(4))
    for r in range(repeats):
        env.day = r
        exps = [
            platform.ab_test(10_000_000 + 1000 * r + k, env.start_day, control, c, truth=True)
            for k, c in enumerate(configs)
        ]
        v = scorer.arm_values(env, exps)  # [E, 2]
        old_pred[r] = v[:, 1] / v[:, 0].mean() - 1
        tv = np.array([e.arm_values() for e in exps])
        old_true[r] = tv[:, 1] / tv[:, 0].mean() - 1
        multi = platform.multi_arm_test(20_000_000 + r, env.start_day, control, configs, True)
        v = scorer.arm_values(env, multi)
        new_pred[r] = v[:, 1] / v[0, 0] - 1
        tv = np.array([e.arm_values() for e in multi])
        new_true[r] = tv[:, 1] / tv[0, 0] - 1
        platform.advance(control)
    return {
        "users_per_arm": users,
        "old_predicted": noise_and_spread(old_pred),
        "old_true": noise_and_spread(old_true),
        "new_predicted": noise_and_spread(new_pred),
        "new_true": noise_and_spread(new_true),
        "mean_predicted_lift": new_pred.mean(0).tolist(),
        "mean_true_lift": new_true.mean(0).tolist(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--edits", type=int, default=8)
    p.add_argument("--repeats", type=int, default=16)
    p.add_argument("--users", type=int, nargs="+", default=[100, 300])
    p.add_argument("--out", default="runs/dmrl_noise")
    args = p.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    options = dict(recipe_config("dmrl", [], str(out), args.seed).task.options)
    options["seed"] = args.seed
    cached_lrp(options, out / f"lrp_seed{args.seed}")
    rows = [
        measure(options, args.edits, args.repeats, u, out / f"lrp_seed{args.seed}")
        for u in args.users
    ]
    (out / f"noise_seed{args.seed}.json").write_text(json.dumps(rows, indent=2))
    print(
        "| users/arm | reward | noise (std, one edit repeated) | within-day noise "
        "| spread (std between edits) |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        for k in ("old_predicted", "new_predicted", "old_true", "new_true"):
            r = row[k]
            print(
                f"| {row['users_per_arm']} | {k} | {r['noise'] * 100:.3f}% | "
                f"{r['within_day_noise'] * 100:.3f}% | {r['spread'] * 100:.3f}% |"
            )


if __name__ == "__main__":
    main()
