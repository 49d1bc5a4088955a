"""SRPO studies on the ranking policy: resumable grids of (method, setting, G, seed) cells.

Each cell trains the PL ranker in-process (`Trainer`), evaluates held-out NDCG@10 every
`--eval-every` steps and appends one JSON line to `--out` (its curve against steps, queries
and samples seen, and the mean of the logged `srpo/*` metrics over the first and last ten
steps). A cell already in the file is skipped, and no cell starts after `--max-seconds`, so
a long grid runs as several short invocations (the shared machine's CPU lock).

    python -m studies.srpo.study --grid scale --out studies/srpo/data/scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from policyopt.config.load import load_config
from policyopt.recipes import recipe_dict
from policyopt.store.metrics_log import read_metrics
from policyopt.train.trainer import Trainer

COMMON = [
    "train.num_threads=1",
    "train.loggers=[jsonl]",
    "train.progress=false",
    "train.plot=false",
    "train.save_every=0",
    "train.resume=null",
]


def grid(name: str) -> list[dict[str, Any]]:
    """The cells of a named study."""
    cells: list[dict[str, Any]] = []
    if name in ("scale", "scale_clicks"):  # the distance's scale and the temperature, G = 8
        variants = [("reverse", 1.0), ("reverse", 4.0), ("group_mean", 1.0), ("group_mean", 2.0)]
        variants += [("group_mean", 0.5), ("none", 1.0)]
        setting, steps, seeds = ("synthetic", 60, 10) if name == "scale" else ("clicks", 150, 5)
        for seed in range(seeds):
            for norm, tau in variants:
                options = {"normalize": norm, "temperature": tau}
                cells.append(cell("srpo", setting, 8, seed, steps, options))
            cells.append(cell("grpo", setting, 8, seed, steps))
    elif name in ("clicks", "diversity", "mslr", "mslr_off"):
        steps = {"clicks": 100, "diversity": 60, "mslr": 100, "mslr_off": 100}[name]
        for g in (8, 64, 2, 4, 16):  # the paper's pair (8 vs 64) first
            for seed in range(5):
                for method in ("srpo", "grpo", "pgrank"):
                    cells.append(cell(method, name, g, seed, steps))
    elif name == "lambdarank":  # the tuned LambdaRank reference of each setting, 5 seeds
        for setting in ("diversity", "mslr", "synthetic", "clicks"):
            for seed in range(5):
                cells.append(cell("lambdarank", setting, 0, seed, 0))
    else:
        raise ValueError(
            f"unknown grid {name!r}; valid: scale, scale_clicks, clicks, diversity, mslr, mslr_off, "
            "lambdarank"
        )
    return cells


def cell(
    method: str,
    setting: str,
    group_size: int,
    seed: int,
    steps: int,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "method": method,
        "setting": setting,
        "group_size": group_size,
        "seed": seed,
        "steps": steps,
        "options": options or {},
    }


SETTINGS: dict[str, list[str]] = {
    "synthetic": [],
    "clicks": [
        "task.name=ltr_clicks",
        "task.options={}",
        "rollout.prompts_per_step=8",
        "eval.size=100",
    ],
    "diversity": ["task.name=ltr_diversity", "task.options={}"],
    "mslr": ["task.name=mslr", "task.options={}", "rollout.prompts_per_step=8"],
    # Off-policy: 2 epochs of 2 minibatches per batch (4 optimizer steps; the clip acts).
    "mslr_off": [
        "task.name=mslr",
        "task.options={}",
        "rollout.prompts_per_step=8",
        "algorithm.ppo_epochs=2",
        "algorithm.minibatches=2",
    ],
}


def overrides(c: dict[str, Any], out: Path, eval_every: int) -> tuple[dict[str, Any], list[str]]:
    recipe = {"grpo": "ranking_grpo", "pgrank": "ranking_pgrank"}.get(c["method"], "srpo")
    base = recipe_dict(recipe)
    extra = [
        *COMMON,
        f"train.output_dir={out}",
        f"train.seed={c['seed']}",
        f"train.steps={c['steps']}",
        f"rollout.group_size={c['group_size']}",
        f"eval.every={eval_every}",
        *SETTINGS[c["setting"]],
    ]
    if c["options"]:
        extra.append("algorithm.advantage_options=" + json.dumps(c["options"]))
    return base, extra


def run_lambdarank(c: dict[str, Any]) -> dict[str, Any]:
    """Tuned LambdaRank on the setting's task (full labels: a reference, not a peer of RL
    from rewards), held-out NDCG@10 (and α-NDCG@10 on the diversity task)."""
    from policyopt.envs.ltr.baselines import lambdarank_tuned
    from policyopt.tasks import TASKS

    with tempfile.TemporaryDirectory() as tmp:
        base, extra = overrides({**c, "method": "srpo", "group_size": 8}, Path(tmp), 0)
        config = load_config(None, extra, base=base)
    task = TASKS.get(config.task.name)(**config.task.options)
    start = time.perf_counter()
    got = lambdarank_tuned(task, 10, seed=c["seed"], eval_size=config.eval.size)
    if got is None:
        raise RuntimeError("lightgbm is not installed: pip install 'policyopt[rank]'")
    out = {**c, "curve": [], "final_ndcg@10": got["ndcg"], "lambdarank": got}
    if "alpha_ndcg" in got:
        out["final_alpha_ndcg@10"] = got["alpha_ndcg"]
        out["alpha_curve"] = [got["alpha_ndcg"]]
    out["wall_s"] = time.perf_counter() - start
    return out


def run_cell(c: dict[str, Any], eval_every: int) -> dict[str, Any]:
    if c["method"] == "lambdarank":
        return run_lambdarank(c)
    with tempfile.TemporaryDirectory() as tmp:
        base, extra = overrides(c, Path(tmp), eval_every)
        config = load_config(None, extra, base=base)
        start = time.perf_counter()
        trainer = Trainer(config)
        first = trainer.evaluate()
        trainer.train()
        trainer.close()
        records = read_metrics(Path(tmp) / "metrics.jsonl")
    per_step = config.rollout.prompts_per_step
    curve = [(0, 0, 0, first["eval/ndcg@10"])] + [
        (
            r["step"],
            r["step"] * per_step,
            r["step"] * per_step * c["group_size"],
            r["eval/ndcg@10"],
        )
        for r in records
        if "eval/ndcg@10" in r
    ]
    out = {**c, "curve": curve, "final_ndcg@10": curve[-1][3], "wall_s": 0.0}
    alpha = [r["eval/alpha_ndcg@10"] for r in records if "eval/alpha_ndcg@10" in r]
    if alpha:  # the diversity task's objective
        out["alpha_curve"] = [first["eval/alpha_ndcg@10"], *alpha]
        out["final_alpha_ndcg@10"] = alpha[-1]
    for key in ("srpo/saturation", "srpo/corr_grpo", "srpo/zero_distance_pairs"):
        values = [r[key] for r in records if key in r]
        if values:
            out[key + "/first10"] = sum(values[:10]) / len(values[:10])
            out[key + "/last10"] = sum(values[-10:]) / len(values[-10:])
    out["reward_last10"] = _mean([r.get("reward/mean") for r in records[-10:]])
    out["wall_s"] = time.perf_counter() - start
    return out


def _mean(values: list[Any]) -> float | None:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


def key(c: dict[str, Any]) -> str:
    return json.dumps({k: c[k] for k in sorted(cell("", "", 0, 0, 0))}, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-seconds", type=float, default=420.0)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--methods", default="", help="comma-separated methods to run (default all)")
    p.add_argument("--groups", default="", help="comma-separated group sizes (default all)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    methods = set(filter(None, args.methods.split(",")))
    groups = {int(g) for g in args.groups.split(",") if g}
    start = time.perf_counter()
    ran = 0
    for c in grid(args.grid):
        if (methods and c["method"] not in methods) or (groups and c["group_size"] not in groups):
            continue
        if key(c) in _done(out):
            continue
        if time.perf_counter() - start > args.max_seconds:
            break
        result = run_cell(c, args.eval_every)
        ran += 1
        with out.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(
            f"{c['method']:7s} {c['setting']} G={c['group_size']:<3d} seed={c['seed']} "
            f"{json.dumps(c['options'])} ndcg@10={result['final_ndcg@10']:.4f} "
            f"sat={result.get('srpo/saturation/last10', float('nan')):.3f} "
            f"corr={result.get('srpo/corr_grpo/last10', float('nan')):.3f} "
            f"{result['wall_s']:.1f}s",
            flush=True,
        )
    left = sum(key(c) not in _done(out) for c in grid(args.grid))
    print(f"ran {ran} cells; {left} of the grid's {len(grid(args.grid))} not done")
    return 0


def _done(out: Path) -> set[str]:
    if not out.exists():
        return set()
    return {key(json.loads(x)) for x in out.read_text().splitlines() if x.strip()}


if __name__ == "__main__":
    raise SystemExit(main())
