"""The equal-token study's table and pass@k figure from its runs' summaries.

python p64_report.py DIR [PNG]: DIR holds grpo/seed-S and datpo@eq/seed-S (this folder);
prints the markdown table of studies/record.md and, with PNG, draws pass@k against k.
"""

import json
import sys
from pathlib import Path

from policyopt.core.stats import mean_ci

KEYS = ["accuracy", "pass@1", "pass@8", "pass@16", "pass@32", "pass@64", "distinct_correct@64"]
CELLS = ("grpo", "datpo@eq")


def summary(root: Path, cell: str, seed: int) -> dict:
    return json.loads((root / cell / f"seed-{seed}" / "summary.json").read_text())


def paired(xs: list[float], ys: list[float]) -> str:
    diffs = [y - x for x, y in zip(xs, ys, strict=True)]
    m, h = mean_ci(diffs)
    return f"{m:+.3f} ± {h:.3f} ({', '.join(f'{d:+.3f}' for d in diffs)})"


def table(root: Path, seeds: list[int]) -> str:
    lines = ["| quantity | SFT start | grpo | datpo | datpo − grpo | grpo − SFT | datpo − SFT |"]
    for key in KEYS:
        sft = [summary(root, "grpo", s)["initial_eval"][f"eval/{key}"] for s in seeds]
        grpo = [summary(root, "grpo", s)["final_eval"][f"eval/{key}"] for s in seeds]
        datpo = [summary(root, "datpo@eq", s)["final_eval"][f"eval/{key}"] for s in seeds]
        means = " | ".join("{:.3f} ± {:.3f}".format(*mean_ci(v)) for v in (sft, grpo, datpo))
        diffs = " | ".join(paired(a, b) for a, b in ((grpo, datpo), (sft, grpo), (sft, datpo)))
        lines.append(f"| {key} | {means} | {diffs} |")
    return "\n".join(lines)


def plot(root: Path, seeds: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [1, 2, 4, 8, 16, 32, 64]
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, cell, which in [
        ("SFT start", "grpo", "initial_eval"),
        ("grpo, 30 steps", "grpo", "final_eval"),
        ("datpo, equal tokens", "datpo@eq", "final_eval"),
    ]:
        stats = [
            mean_ci([summary(root, cell, s)[which][f"eval/pass@{k}"] for s in seeds]) for k in ks
        ]
        mean = [m for m, _ in stats]
        ax.plot(ks, mean, marker="o", label=label)
        ax.fill_between(
            ks, [m - h for m, h in stats], [min(1, m + h) for m, h in stats], alpha=0.15
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k (of 64 samples per problem)")
    ax.set_ylabel("pass@k (100 held-out problems)")
    ax.set_title(f"Countdown, equal generated tokens, {len(seeds)} seeds (95% t band)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    root = Path(sys.argv[1])
    seeds = [
        s
        for s in range(5)
        if all((root / c / f"seed-{s}" / "summary.json").exists() for c in CELLS)
    ]
    print(f"seeds {seeds}")
    print(table(root, seeds))
    if len(sys.argv) > 2:
        plot(root, seeds, sys.argv[2])
