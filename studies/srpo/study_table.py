"""Tables of an `srpo_study` results file: per (setting, method, options, G), mean ± 95% CI
(Student t) over seeds of the final held-out metric, of its mean over the evaluation curve
(area under the curve, the learning speed) and of the logged srpo metrics.

    python -m studies.srpo.study_table studies/srpo/data/scale.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from policyopt.core.stats import mean_ci


def fmt_ci(values: list[float]) -> str:
    """`mean ± half-width` of the 95% t interval; "-" for none, the mean alone for one."""
    if not values:
        return "-"
    mean, half = mean_ci(values)
    return f"{mean:.3f}" if len(values) < 2 else f"{mean:.3f} ± {half:.3f}"


def table(rows: list[dict[str, Any]], metric: str = "final_ndcg@10") -> str:
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        label = r["method"] + (
            " " + ",".join(f"{k}={v}" for k, v in sorted(r["options"].items()))
            if r["options"]
            else ""
        )
        cells[(r["setting"], r["group_size"], label)].append(r)
    out = [
        f"| setting | G | method | seeds | {metric} | curve mean (AUC) | saturation (last 10) "
        "| corr_grpo (last 10) | final − grpo (paired by seed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    grpo = {
        (r["setting"], r["group_size"], r["seed"]): r[metric] for r in rows if r["method"] == "grpo"
    }
    for (setting, g, label), rs in sorted(cells.items()):
        if metric == "final_alpha_ndcg@10":
            auc = [sum(r["alpha_curve"]) / len(r["alpha_curve"]) for r in rs]
        else:
            auc = [sum(p[3] for p in r["curve"]) / len(r["curve"]) for r in rs if r["curve"]]
        out.append(
            f"| {setting} | {g} | {label} | {len(rs)} | "
            f"{fmt_ci([r[metric] for r in rs])} | {fmt_ci(auc)} | "
            f"{fmt_ci([r['srpo/saturation/last10'] for r in rs if 'srpo/saturation/last10' in r])} | "
            f"{fmt_ci([r['srpo/corr_grpo/last10'] for r in rs if 'srpo/corr_grpo/last10' in r])} | "
            f"{fmt_ci(paired(rs, grpo, metric)) if not label.startswith('grpo') else '-'} |"
        )
    return "\n".join(out)


def paired(rs: list[dict[str, Any]], grpo: dict[tuple, float], metric: str) -> list[float]:
    out = []
    for r in rs:
        other = grpo.get((r["setting"], r["group_size"], r["seed"]))
        if other is not None:
            out.append(r[metric] - other)
    return out


def at_samples(curve: list[list[float]], samples: float) -> float | None:
    """The curve's metric at `samples` rollouts seen (linear between evaluations; None past
    its end)."""
    for (_, _, s0, v0), (_, _, s1, v1) in zip(curve, curve[1:], strict=False):
        if s0 <= samples <= s1:
            return v0 + (v1 - v0) * (samples - s0) / (s1 - s0) if s1 > s0 else v1
    return None


def budget_table(rows: list[dict[str, Any]], samples: float) -> str:
    """Held-out NDCG@10 of each (method, G) after `samples` rollouts (equal sample budget)."""
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        v = at_samples(r["curve"], samples) if r["curve"] else None
        if v is not None:
            cells[(r["setting"], r["group_size"], r["method"])].append(v)
    out = [
        f"| setting | G | method | seeds | NDCG@10 after {samples:g} samples |",
        "|---|---|---|---|---|",
    ]
    for (setting, g, method), vs in sorted(cells.items()):
        out.append(f"| {setting} | {g} | {method} | {len(vs)} | {fmt_ci(vs)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if args and args[0] == "--at-samples":
        samples = float(args[1])
        for path in args[2:]:
            rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
            print(f"{path}\n\n{budget_table(rows, samples)}\n")
        return 0
    for path in args:
        rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
        print(f"{path}\n\n{table(rows)}\n")
        if all("final_alpha_ndcg@10" in r for r in rows):
            print(f"{table(rows, 'final_alpha_ndcg@10')}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
