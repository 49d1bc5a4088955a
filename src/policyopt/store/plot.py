"""A PNG of a run's curves, drawn at the end of training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS = [
    ("reward/mean", "reward mean"),
    ("reward/*", "reward by function"),  # one line per reward function
    ("accuracy", "train accuracy"),
    ("eval/accuracy", "held-out greedy accuracy"),
    ("loss", "policy loss"),
    ("response_length/mean", "response length"),
    ("entropy", "entropy"),
    ("approx_kl", "approx KL to old policy"),
]
# reward/<key> entries that are not one function's mean reward
NOT_FUNCTIONS = {"reward/mean", "reward/std", "reward/shaped_mean"}


def reward_function_keys(records: list[dict[str, Any]]) -> list[str]:
    """The per-function mean rewards the run logged (`reward/<name>`)."""
    keys = {
        k
        for r in records
        for k in r
        if k.startswith("reward/") and k not in NOT_FUNCTIONS and not k.endswith("/unparseable")
    }
    return sorted(keys)


def plot_metrics(records: list[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """Plot the panels present in `records` into `path`; None if there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    functions = reward_function_keys(records)
    panels = [
        (k, label)
        for k, label in PANELS
        if (functions if k == "reward/*" else any(r.get(k) is not None for r in records))
    ]
    if not panels:
        return None
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (key, label) in zip(axes.flat, panels, strict=False):
        for line in functions if key == "reward/*" else [key]:
            points = [(r["step"], r[line]) for r in records if r.get(line) is not None]
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="." if len(points) < 30 else None,
                label=line.removeprefix("reward/"),
            )
        if key == "reward/*":
            ax.legend(fontsize=7)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
