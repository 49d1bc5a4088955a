"""DMRL's ablation (the paper's Table 4) on the simulator: the true long-term value of the
final deployed configuration relative to the start, per method, over seeds.

    python -m studies.dmrl.ablation --seeds 0 1 2 --out runs/dmrl_ablation [KEY=VALUE ...]

Variants (each the `dmrl` recipe with these overrides; the same seed shares its LRP and its
SFT warm start, both cached): DRPO; without MAD (plain z-score, `robust=false`); without
the control term (`alpha=1`); without the edit cost (`lambda_edit=0`); vanilla GRPO
(`algorithm.advantage=grpo`). Writes `ablation.json` and prints a table: mean relative gain
and its 95% confidence interval (Student t over seeds).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from policyopt.core.stats import mean_ci
from policyopt.methods.dmrl.drpo import ALPHA, DELTA, LAMBDA_EDIT
from policyopt.pipelines.dmrl import run_dmrl_pipeline
from policyopt.recipes import recipe_config

_DRPO = {"alpha": ALPHA, "lambda_edit": LAMBDA_EDIT, "delta": DELTA}
VARIANTS: dict[str, dict[str, Any]] = {
    "drpo": {"algorithm.advantage_options": _DRPO},
    "no_mad": {"algorithm.advantage_options": {**_DRPO, "robust": False}},
    "no_control": {"algorithm.advantage_options": {**_DRPO, "alpha": 1.0}},
    "no_edit_cost": {"algorithm.advantage_options": {**_DRPO, "lambda_edit": 0.0}},
    "grpo": {"algorithm.advantage": "grpo", "algorithm.advantage_options": {}},
}


def run_ablation(
    seeds: list[int], out: Path, overrides: list[str], variants: list[str]
) -> dict[str, Any]:
    console = Console()
    results: dict[str, Any] = {}
    for name in variants:
        gains = []
        for seed in seeds:
            run_dir = out / name / f"seed{seed}"
            summary_path = run_dir / "summary.json"
            if not summary_path.exists():
                extra = [f"{k}={json.dumps(v)}" for k, v in VARIANTS[name].items()]
                config = recipe_config(
                    "dmrl",
                    [*overrides, *extra, "train.resume=null", "train.progress=false"],
                    str(run_dir),
                    seed,
                )
                run_dmrl_pipeline(config, console)
            gains.append(json.loads(summary_path.read_text())["relative_gain"])
        mean, half = mean_ci(gains)
        results[name] = {"gains": gains, "mean": mean, "ci95": half}
        console.print(f"{name}: {mean * 100:+.3f}% ± {half * 100:.3f} (seeds {seeds})")
    (out / "ablation.json").write_text(json.dumps(results, indent=2))
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/dmrl_ablation")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = run_ablation(args.seeds, out, args.overrides, args.variants)
    print("| variant | relative gain of the final config (mean ± 95% CI) | per seed |")
    print("|---|---|---|")
    for name, r in results.items():
        per = ", ".join(f"{g * 100:+.2f}%" for g in r["gains"])
        print(f"| {name} | {r['mean'] * 100:+.3f}% ± {r['ci95'] * 100:.3f} | {per} |")


if __name__ == "__main__":
    main()
