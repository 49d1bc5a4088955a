"""A study's report: DIR/report.md (outcomes, paired differences against a baseline with 95%
CIs, mechanism metrics, every run's exact command) and DIR/curves.png (learning curves with
bands and the mechanism metrics side by side)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from policyopt.cli.study import Run
from policyopt.core.stats import mean_ci

# Logged every step: the learning curve, then the mechanism metrics (whatever the loss).
CURVE = "reward/mean"
MECHANISM_PREFIX = "mech/"
MECHANISM_EXTRA = ("grad_norm", "response_length/mean")


def fmt(value: tuple[float, float]) -> str:
    mean, half = value
    if not math.isfinite(mean):
        return "n/a"
    digits = 0 if abs(mean) >= 1000 else 3  # token counts, seconds
    return f"{mean:.{digits}f} ± {half:.{digits}f}" if math.isfinite(half) else f"{mean:.{digits}f}"


def summaries(
    runs: list[Run], records: dict[Run, list[dict[str, Any]]] | None = None
) -> dict[str, dict[int, dict[str, Any]]]:
    """cell -> seed -> summary.json, for the finished runs, in the study's order; with
    `generated_tokens`, the RL phase's total (its last logged `generated_tokens_total`), so
    that methods that sample more (DAPO's dynamic sampling, DATPO's trees) are read at
    their cost. `records`: each run's step records when the caller has read them already."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for run in runs:
        out.setdefault(run.cell, {})
        if run.finished():
            summary = json.loads((run.out / "summary.json").read_text())
            steps = records[run] if records is not None else step_records(run)
            totals = [r.get("generated_tokens_total") for r in steps]
            totals = [t for t in totals if t is not None]
            if totals and "generated_tokens" not in summary:
                summary["generated_tokens"] = float(totals[-1])
            out[run.cell][run.seed] = summary
    return out


def outcome(summary: dict[str, Any], key: str) -> float:
    if key == "gain":
        return summary["final_accuracy"] - summary["initial_accuracy"]
    if key in summary and isinstance(summary[key], (int, float)):
        return float(summary[key])
    return float(summary["final_eval"].get(key, math.nan))


def outcome_keys(cells: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    done = [s for by_seed in cells.values() for s in by_seed.values()]
    if not done:
        return []
    common = set.intersection(*(set(s["final_eval"]) for s in done))
    passes = sorted(
        (k for k in common if k.startswith("eval/pass@")), key=lambda k: int(k.split("@")[1])
    )
    distinct = sorted(
        (k for k in common if k.startswith("eval/distinct_correct@")),
        key=lambda k: int(k.split("@")[1]),
    )
    keys = ["initial_accuracy", "final_accuracy", "gain", *passes, *distinct]
    extra = ("median_response_tokens", "segments_per_response", "generated_tokens", "rl_seconds")
    keys += [k for k in extra if all(k in s for s in done)]
    return keys


def paired(
    cells: dict[str, dict[int, dict[str, Any]]], baseline: str, key: str
) -> dict[str, tuple[tuple[float, float], list[float]]]:
    """cell -> (mean ± CI of cell - baseline over the seeds both finished, per-seed values)."""
    base = cells.get(baseline, {})
    out = {}
    for cell, by_seed in cells.items():
        if cell == baseline:
            continue
        seeds = sorted(set(by_seed) & set(base))
        diffs = [outcome(by_seed[s], key) - outcome(base[s], key) for s in seeds]
        out[cell] = (mean_ci(diffs) if diffs else (math.nan, math.nan), diffs)
    return out


def step_records(run: Run) -> list[dict[str, Any]]:
    from policyopt.store.metrics_log import read_metrics

    path = run.out / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def mechanism_keys(records: list[dict[str, Any]]) -> list[str]:
    keys = {k for r in records for k in r if k.startswith(MECHANISM_PREFIX)}
    return sorted(keys) + [k for k in MECHANISM_EXTRA if any(k in r for r in records)]


def run_means(records: list[dict[str, Any]], keys: list[str]) -> dict[str, float]:
    """Each key's mean over the run's steps (finite values only)."""
    out = {}
    for k in keys:
        vals = [float(r[k]) for r in records if k in r and math.isfinite(float(r[k]))]
        out[k] = sum(vals) / len(vals) if vals else math.nan
    return out


def write_report(
    runs: list[Run],
    status: dict[str, str],
    root: Path,
    *,
    baseline: str,
    study_command: str,
) -> str:
    records = {run: step_records(run) for run in runs}
    cells = summaries(runs, records)
    if baseline not in cells:
        raise ValueError(
            f"--baseline {baseline!r} is not a cell of the study; cells: {', '.join(cells)}"
        )
    seeds_of = {c: sorted(s) for c, s in cells.items()}
    keys = outcome_keys(cells)
    lines = [f"# Study report\n\nStudy command: `{study_command}`\n"]
    finished = sum(r.finished() for r in runs)
    lines.append(f"Runs finished: {finished} of {len(runs)}.\n")
    lines.append("## Outcomes (mean ± 95% Student-t CI over the finished seeds)\n")
    lines.append("| cell | seeds | " + " | ".join(keys) + " |")
    lines.append("|---|---|" + "---|" * len(keys))
    for cell, by_seed in cells.items():
        vals = [fmt(mean_ci([outcome(s, k) for s in by_seed.values()])) for k in keys]
        seeds = ",".join(map(str, seeds_of[cell])) or "none"
        lines.append(f"| {cell} | {seeds} | " + " | ".join(vals) + " |")
    lines.append(f"\n## Paired differences against {baseline} (same seed, cell - baseline)\n")
    diff_keys = [k for k in keys if k != "initial_accuracy"]
    lines.append("| cell | " + " | ".join(diff_keys) + " |")
    lines.append("|---|" + "---|" * len(diff_keys))
    per_key = {k: paired(cells, baseline, k) for k in diff_keys}
    for cell in cells:
        if cell == baseline:
            continue
        row = []
        for k in diff_keys:
            ci, per_seed = per_key[k][cell]
            row.append(f"{fmt(ci)} ({', '.join(f'{d:+.3f}' for d in per_seed)})")
        lines.append(f"| {cell} | " + " | ".join(row) + " |")
    mech = mechanism_keys([r for recs in records.values() for r in recs])
    if mech:
        lines.append("\n## Mechanism metrics (each run's mean over its steps; mean ± CI)\n")
        lines.append("| cell | " + " | ".join(mech) + " |")
        lines.append("|---|" + "---|" * len(mech))
        for cell in cells:
            means = [run_means(records[r], mech) for r in runs if r.cell == cell and records[r]]
            row = [
                fmt(mean_ci([m[k] for m in means if math.isfinite(m[k])] or [math.nan]))
                for k in mech
            ]
            lines.append(f"| {cell} | " + " | ".join(row) + " |")
    plot_curves(runs, records, mech, root / "curves.png")
    lines.append("\n![curves](curves.png)\n")
    lines.append("## Runs and their exact commands\n")
    for run in runs:
        state = status.get(str(run.out), "finished" if run.finished() else "not run")
        lines.append(f"- {run.cell} seed {run.seed} ({state}): `{run.command}`")
    text = "\n".join(lines) + "\n"
    (root / "report.md").write_text(text)
    return text


def band(curves: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Per step over the runs that reached it: mean, and the 95% CI's low and high."""
    mean, low, high = [], [], []
    for t in range(max(len(c) for c in curves)):
        vals = [c[t] for c in curves if t < len(c) and math.isfinite(c[t])]
        m, h = mean_ci(vals) if vals else (math.nan, math.nan)
        h = 0.0 if not math.isfinite(h) else h
        mean.append(m)
        low.append(m - h)
        high.append(m + h)
    return mean, low, high


def smooth(values: list[float], window: int) -> list[float]:
    out = []
    for t in range(len(values)):
        part = [v for v in values[max(0, t - window + 1) : t + 1] if math.isfinite(v)]
        out.append(sum(part) / len(part) if part else math.nan)
    return out


def plot_curves(
    runs: list[Run], records: dict[Run, list[dict[str, Any]]], mech: list[str], path: Path
) -> None:
    """One panel per metric (the reward curve first), one line per cell with a 95% band
    over seeds, each run smoothed by a moving average of a tenth of its steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [CURVE, *mech]
    cols = min(4, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    cells = list(dict.fromkeys(r.cell for r in runs))
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for cell in cells:
            curves = []
            for run in runs:
                recs = [r for r in records[run] if metric in r]
                if run.cell == cell and recs:
                    vals = [float(r[metric]) for r in recs]
                    curves.append(smooth(vals, max(1, len(vals) // 10)))
            if not curves:
                continue
            mean, low, high = band(curves)
            steps = list(range(1, len(mean) + 1))
            ax.plot(steps, mean, label=f"{cell} (n={len(curves)})")
            ax.fill_between(steps, low, high, alpha=0.2)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
