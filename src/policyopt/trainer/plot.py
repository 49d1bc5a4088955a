"""A PNG of a run's curves, drawn at the end of training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS = [
    ("reward/mean", "reward mean"),
    ("accuracy", "train accuracy"),
    ("eval/accuracy", "held-out greedy accuracy"),
    ("response_length/mean", "response length"),
    ("entropy", "entropy"),
    ("kl", "approx KL to old policy"),
]


def plot_metrics(records: list[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """Plot the panels present in `records` into `path`; None if there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, label) for k, label in PANELS if any(r.get(k) is not None for r in records)]
    if not panels:
        return None
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (key, label) in zip(axes.flat, panels, strict=False):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        ax.plot(
            [p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None
        )
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
