"""Does choosing by day-1 signals cost long-term value? The day-1 vs 7-day (and 30-day)
tension of the DMRL world, and the large-search baseline that regret is reported against.

    python -m studies.dmrl.tension [--seeds 0 1 2] [--configs 200]
        [--worlds live stationary] [--users 1000] [--search-budget 1000]
        [--out runs/dmrl_tension]

Per world and seed: the platform of that seed brought to the DMRL task's first online day
(live world: the live population after the offline history's 100 days, `history.burn_in`),
and its evaluation users (a snapshot of the live population, as `SkillDocTask` evaluates
on). N random configurations of the editor's level grid (`history.random_levels`) are run
30 days from the users' state (expected values, no noise). Per population and overall:

- Spearman between day-1 value per user and 7-day value (and 30-day);
- regret of choosing by day 1: 1 − V7(best-by-day-1) / V7(best-by-7-day) among the N (and
  the same for 30 days);
- the large search (`adsim.search.large_search`, 7-day value, the budget given): its value,
  the start document's and the best-by-day-1's, as regret to it.

Resumable: one JSON per (world, seed, settings) under --out, skipped when present. Prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import burn_in, random_levels
from policyopt.envs.ads.adsim.params import AdParams
from policyopt.envs.ads.adsim.search import DISTINCT_CONFIGURATIONS, LEVEL_GRID_SIZE, large_search
from policyopt.envs.ads.adsim.world import POP_WORDS
from policyopt.envs.ads.skilldoc.rule_agent import RuleAgent
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT

FIRST_DAY = 100  # the DMRL task's first online day (400 offline experiments, 4 per day)
LONG = 30


def _rho(a: np.ndarray, b: np.ndarray) -> float:
    return float(spearmanr(a, b)[0])


def tension(d1: np.ndarray, d7: np.ndarray, d30: np.ndarray) -> dict[str, float]:
    """Spearman and regret of choosing by day 1 over configurations [N]."""
    return {
        "spearman_1_7": _rho(d1, d7),
        "spearman_1_30": _rho(d1, d30),
        "regret_7": float(1 - d7[d1.argmax()] / d7.max()),
        "regret_30": float(1 - d30[d1.argmax()] / d30.max()),
    }


def measure(world: str, seed: int, configs: int, users: int, budget: int) -> dict[str, Any]:
    platform = AdPlatform(seed, world=world)
    burn_in(platform, FIRST_DAY)
    eval_users = platform.eval_users(users)
    rng = np.random.default_rng([seed, 12])
    params = [AdParams.from_fractions(random_levels(rng)) for _ in range(configs)]
    d1, d7, d30 = (np.zeros((configs, users)) for _ in range(3))
    for k, p in enumerate(params):
        daily = platform.run(eval_users, p, LONG).daily_value
        d1[k], d7[k], d30[k] = daily[0], daily[:7].sum(0), daily.sum(0)
    out: dict[str, Any] = {"world": world, "seed": seed, "configs": configs, "users": users}
    out["all"] = tension(d1.mean(1), d7.mean(1), d30.mean(1))
    for p, name in enumerate(POP_WORDS):
        m = eval_users.population == p
        out[name] = tension(d1[:, m].mean(1), d7[:, m].mean(1), d30[:, m].mean(1))
        out[name]["users"] = int(m.sum())

    def v7(q: AdParams) -> float:
        return platform.value(q, eval_users)

    search = large_search(v7, budget, seed)
    start = v7(RuleAgent()(START_DOCUMENT))
    by_day1 = float(d7.mean(1)[d1.mean(1).argmax()])
    out["search"] = {
        "budget": budget,
        "evaluations": search.evaluations,
        "value": search.value,
        "best": search.params().as_dict(),
        "start_value": start,
        "defaults_value": v7(AdParams()),
        "best_random_7day": float(d7.mean(1).max()),
        "best_by_day1_7day": by_day1,
        "start_regret": 1 - start / search.value,
        "best_by_day1_regret": 1 - by_day1 / search.value,
        "best_random_regret": 1 - float(d7.mean(1).max()) / search.value,
        "trace_at": {str(n): search.trace[min(n, len(search.trace)) - 1] for n in (50, 200, 500)},
    }
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per world and population, mean ± std over seeds."""
    lines = [
        "| world | population | Spearman day1-7d | Spearman day1-30d | regret 7d of best-by-day-1 "
        "| regret 30d |",
        "|---|---|---|---|---|---|",
    ]
    for world in dict.fromkeys(r["world"] for r in rows):
        rs = [r for r in rows if r["world"] == world]
        for pop in ("all", *POP_WORDS):

            def ms(key: str, pct: bool = False, pop: str = pop, rs: list = rs) -> str:
                x = np.array([r[pop][key] for r in rs]) * (100 if pct else 1)
                f = ".1f" if pct else ".2f"
                vals = " / ".join(format(v, f) for v in x)
                return f"{x.mean():{f}}{'%' if pct else ''} ({vals})"

            lines.append(
                f"| {world} | {pop} | {ms('spearman_1_7')} | {ms('spearman_1_30')} "
                f"| {ms('regret_7', True)} | {ms('regret_30', True)} |"
            )
    lines += [
        "",
        "| world | seed | search value (evals) | start doc regret | best-by-day-1 regret "
        "| best of N random regret | all defaults |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["search"]
        lines.append(
            f"| {r['world']} | {r['seed']} | {s['value']:.3f} ({s['evaluations']}) "
            f"| {s['start_regret'] * 100:.1f}% | {s['best_by_day1_regret'] * 100:.1f}% "
            f"| {s['best_random_regret'] * 100:.1f}% | {s['defaults_value']:.3f} |"
        )
    lines.append(
        f"\nLevel grid: {LEVEL_GRID_SIZE:,} points; {DISTINCT_CONFIGURATIONS:,} distinct "
        "configurations with the defaults."
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--configs", type=int, default=200)
    p.add_argument("--worlds", nargs="+", default=["live", "stationary"])
    p.add_argument("--users", type=int, default=1000)
    p.add_argument("--search-budget", type=int, default=1000)
    p.add_argument("--out", default="runs/dmrl_tension")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for world in args.worlds:
        for seed in args.seeds:
            name = f"{world}_seed{seed}_n{args.configs}_u{args.users}_b{args.search_budget}"
            path = out / f"{name}.json"
            if not path.exists():
                row = measure(world, seed, args.configs, args.users, args.search_budget)
                path.write_text(json.dumps(row, indent=2))
            rows.append(json.loads(path.read_text()))
    print(table(rows))


if __name__ == "__main__":
    main()
