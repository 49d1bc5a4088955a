"""Each shipped recipe's headline metric before and after RL, one `policyopt quickstart` run
per recipe and seed, as a user would run it.

    python -m studies.recipes.headlines --out studies/recipes/data/seed0.jsonl --seeds 0
    python -m studies.recipes.headlines --recipes grpo --seeds 0 1 2 \\
        --set model.precision=bf16-mixed --out studies/recipes/data/grpo_bf16.jsonl
    python -m studies.recipes.headlines --table studies/recipes/data/seed0.jsonl

One JSON line per (recipe, seed) is appended to --out as each run ends, so an interrupted
sweep resumes where it stopped (cells already in the file are skipped). The run folders go
under runs/recipes/ (not kept); the line keeps what the table needs: the metric, its value
before and after, the wall time and the load average at both ends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from policyopt.recipes import recipe_names

# The cheap recipes first, so that a sweep cut short has covered the most recipes.
ORDER = [
    "grpo", "hispo", "gar", "datpo", "srpo", "ranking_grpo", "ranking_pgrank",
    "srpo_clicks", "srpo_diversity", "tools", "dmrl", "docpo", "docpo_nosaa",
    "rerank_srpo", "countdown", "dmrl_smollm2", "dmrl_episode",
]  # fmt: skip


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The recipe's own headline metric (what `policyopt quickstart` prints first)."""
    if "final_ndcg@10" in summary:
        return {
            "metric": "held-out NDCG@10",
            "before": summary["initial_ndcg@10"],
            "after": summary["final_ndcg@10"],
        }
    if "final_long_term_value" in summary:
        return {
            "metric": "true 7-day value per user of the deployed configuration",
            "before": summary["initial_long_term_value"],
            "after": summary["final_long_term_value"],
        }
    return {
        "metric": "held-out greedy accuracy",
        "before": summary["initial_accuracy"],
        "after": summary["final_accuracy"],
        "reward_before": summary["initial_eval"]["eval/reward"],
        "reward_after": summary["final_eval"]["eval/reward"],
    }


def done_cells(out: Path) -> set[tuple[str, int, str]]:
    if not out.exists():
        return set()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {(r["recipe"], r["seed"], " ".join(r["overrides"])) for r in rows}


def run_cell(recipe: str, seed: int, overrides: list[str], folder: Path) -> dict[str, Any]:
    # `python -m` rather than the `policyopt` script: the run uses the package this
    # interpreter imports (PYTHONPATH may point at a frozen checkout of the code measured).
    command = [
        sys.executable, "-m", "policyopt.cli.main", "quickstart", recipe, "--seed", str(seed),
        "--output-dir", str(folder), "train.progress=false", *overrides,
    ]  # fmt: skip
    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    log = folder.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        rc = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    row: dict[str, Any] = {
        "recipe": recipe,
        "seed": seed,
        "overrides": overrides,
        "command": " ".join(["policyopt", *command[3:]]),
        "rc": rc,
        "wall_s": round(wall, 1),
        "load_start": round(load_start, 2),
        "load_end": round(os.getloadavg()[0], 2),
    }
    if rc == 0:
        row.update(headline(json.loads((folder / "summary.json").read_text())))
    else:
        row["log_tail"] = log.read_text().splitlines()[-5:]
    return row


def table(path: Path) -> str:
    """The file's rows as a markdown table, one line per (recipe, seed, overrides)."""
    lines = [
        "| recipe | seed | overrides | metric | before | after | change | wall | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for line in path.read_text().splitlines():
        r = json.loads(line)
        extra = " ".join(o for o in r["overrides"] if o != "train.num_threads=1") or "-"
        if r["rc"] != 0:
            cells = [r["recipe"], r["seed"], extra, f"failed (rc {r['rc']})", "", "", ""]
        else:
            change = r["after"] - r["before"]
            cells = [r["recipe"], r["seed"], extra, r["metric"], f"{r['before']:.3f}"]
            cells += [f"{r['after']:.3f}", f"{change:+.3f}"]
        cells += [f"{r['wall_s'] / 60:.1f} min", f"{r['load_start']}-{r['load_end']}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=None, help="print FILE's table, run nothing")
    parser.add_argument("--recipes", nargs="*", default=None, help="default: every recipe")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0])
    parser.add_argument("--set", nargs="*", default=[], help="KEY=VALUE overrides")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runs", type=Path, default=Path("runs/recipes"))
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(args.table))
        return
    if args.out is None:
        parser.error("--out is required to run recipes")
    names = args.recipes or [r for r in ORDER if r in recipe_names()]
    missing = sorted(set(recipe_names()) - set(names)) if args.recipes is None else []
    if missing:
        sys.exit(f"recipes not in ORDER: {missing}; add them")
    done = done_cells(args.out)
    tag = "-".join(o.replace("=", "_").replace(".", "_") for o in args.set) or "default"
    for recipe in names:
        for seed in args.seeds:
            if (recipe, seed, " ".join(args.set)) in done:
                continue
            folder = args.runs / tag / recipe / f"seed-{seed}"
            row = run_cell(recipe, seed, args.set, folder)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
