"""The DMRL editor study's curves (issue 20): per step, the proposals' true 7-day lift minus
that of random well-formed edits from the same state (10-step running mean), and the
deployed configuration's true value relative to the start; mean over seeds, 95% t band.

    python studies/dmrl/plot_proposals.py [--study studies/dmrl/data/editor] [--out FIG]

Reads `<arm>/seed<S>/dmrl_days.jsonl` and `summary.json` (what
`python -m studies.dmrl.editor_study` writes); writes `proposals.png` beside them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from policyopt.core.stats import mean_ci  # noqa: E402
from studies.dmrl.editor_study import days as day_records  # noqa: E402

ARMS = ["random", "sft", "grpo", "drpo", "no_mad", "no_control", "no_edit_cost"]
WINDOW = 10


def running_mean(x: np.ndarray, w: int) -> np.ndarray:
    c = np.cumsum(np.insert(x, 0, 0.0))
    out = np.empty_like(x)
    for i in range(len(x)):
        lo = max(0, i + 1 - w)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def band(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the mean over seeds and the 95% t half-width (0 for one seed)."""
    stats = np.array([mean_ci(col.tolist()) for col in rows.T])
    return stats[:, 0], np.nan_to_num(stats[:, 1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", default=str(Path(__file__).parent / "data" / "editor"))
    p.add_argument("--out", default=None, help="the figure (default: proposals.png beside --study)")
    args = p.parse_args()
    study = Path(args.study)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm in ARMS:
        seeds = sorted(int(d.name[4:]) for d in (study / arm).glob("seed*") if d.is_dir())
        if not seeds:
            continue
        lift, value = [], []
        for seed in seeds:
            days = day_records(study, arm, seed)
            summary = json.loads((study / arm / f"seed{seed}" / "summary.json").read_text())
            start = summary["initial_long_term_value"]
            d = np.array([r["true_lift"] - r["random_true_lift"] for r in days])
            lift.append(running_mean(d, WINDOW) * 100)
            value.append((np.array([r["deployed_true_value"] for r in days]) / start - 1) * 100)
        steps = np.arange(1, len(lift[0]) + 1)
        for ax, rows in ((ax1, np.array(lift)), (ax2, np.array(value))):
            mean, half = band(rows)
            ax.plot(steps, mean, label=f"{arm} ({len(rows)} seeds)")
            ax.fill_between(steps, mean - half, mean + half, alpha=0.12)
    ax1.axhline(0, color="k", lw=0.7)
    ax1.set(
        xlabel="step (day)",
        ylabel="proposals − random edits, true 7-day lift (%)",
        title=f"editor's proposals against random edits from the same state ({WINDOW}-step mean)",
    )
    ax2.set(
        xlabel="step (day)",
        ylabel="deployed configuration, true 7-day value vs start (%)",
        title="deployed value",
    )
    ax1.title.set_fontsize(9)
    ax2.title.set_fontsize(9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    out = Path(args.out) if args.out else study.parent / "proposals.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
