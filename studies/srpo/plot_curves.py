"""Held-out NDCG@10 curves of the issue 21 grids, mean and 95% interval over seeds.

One panel per setting (clicks, diversity, MSLR on- and off-policy) against queries seen and
against rankings sampled, for G = 8 and G = 64, SRPO / GRPO / PG-Rank. Reads the study's
JSONL files (curve rows: step, queries seen, rankings sampled, NDCG@10).

    python studies/srpo/plot_curves.py   # writes studies/srpo/data/curves.png
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent / "data"  # the study's JSONL; the figure beside them
SETTINGS = ("clicks", "diversity", "mslr", "mslr_off")
T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78}  # Student t, n seeds (n − 1 df)
COLORS = {"srpo": "tab:red", "grpo": "tab:blue", "pgrank": "tab:green"}


def curves(name: str) -> dict[tuple[str, int], list[list[list[float]]]]:
    out: dict[tuple[str, int], list[list[list[float]]]] = defaultdict(list)
    for line in (HERE / f"{name}.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["group_size"] in (8, 64) and not r.get("options"):
            out[(r["method"], r["group_size"])].append(r["curve"])
    return out


def main() -> None:
    fig, axes = plt.subplots(2, len(SETTINGS), figsize=(4.2 * len(SETTINGS), 7))
    for col, name in enumerate(SETTINGS):
        for (method, g), runs in sorted(curves(name).items()):
            for row, x_index in enumerate((1, 2)):  # queries seen, rankings sampled
                ax = axes[row, col]
                keep = [i for i, p in enumerate(runs[0]) if row == 0 or p[x_index] > 0]  # log x
                xs = [runs[0][i][x_index] for i in keep]
                ys = [[run[i][3] for run in runs] for i in keep]
                mean = [statistics.mean(y) for y in ys]
                half = [
                    T95.get(len(y), 2.0) * statistics.stdev(y) / len(y) ** 0.5
                    if len(y) > 1
                    else 0.0
                    for y in ys
                ]
                style = "-" if g == 8 else "--"
                label = f"{method} G={g} ({len(runs)} seeds)"
                ax.plot(xs, mean, style, color=COLORS[method], label=label)
                lo = [m - h for m, h in zip(mean, half, strict=True)]
                hi = [m + h for m, h in zip(mean, half, strict=True)]
                ax.fill_between(xs, lo, hi, color=COLORS[method], alpha=0.12)
                ax.set_xscale("log" if row == 1 else "linear")
                ax.set_xlabel("queries seen" if row == 0 else "rankings sampled (log)")
                ax.set_title(name)
                ax.set_ylabel("held-out NDCG@10")
        axes[0, col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "curves.png", dpi=90)


if __name__ == "__main__":
    main()
