"""`policyopt compare`: methods side by side on one task, model and budget, over seeds."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from policyopt.core.stats import mean_ci


def add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare methods over seeds: mean and 95%% CI",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="For each recipe and seed, the whole quickstart pipeline: SFT warm start "
        "(cached, shared by methods with the same SFT settings), RL, and held-out evaluation "
        "(greedy accuracy, pass@k from --samples samples), in OUTPUT_DIR/RECIPE/seed-S; then "
        "a table of means with 95% intervals (compare.md, compare.json) and compare.png. A "
        "run whose summary.json exists is reused, not rerun: compare is resumable, and "
        "existing runs laid out that way (policyopt quickstart RECIPE --seed S --output-dir "
        "OUTPUT_DIR/RECIPE/seed-S) are compared without training. Each run takes as long as "
        "a quickstart (about 5 minutes on 2 quiet cores for the grpo recipe).",
    )
    p.add_argument(
        "recipes",
        nargs="+",
        metavar="RECIPE_OR_KEY=VALUE",
        help="recipe or method names (e.g. grpo dapo gspo), then KEY=VALUE overrides for all",
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per recipe")
    p.add_argument("--samples", type=int, default=8, help="samples per held-out problem (pass@k)")
    p.add_argument("--output-dir", default="runs/compare", help="one folder per recipe and seed")
    p.add_argument(
        "--reach",
        default=None,
        metavar="METRIC=VALUE",
        help="also report the first RL step at which the moving average of a logged training "
        "metric (metrics.jsonl) reaches VALUE, e.g. reward/docparse=0.45; +VALUE: a rise by "
        "VALUE over the run's first moving average (runs that start apart), e.g. "
        "reward/docparse=+0.05",
    )
    p.add_argument("--reach-window", type=int, default=10, help="steps in that moving average")
    p.add_argument(
        "--recipe",
        default=None,
        help="run every method as this recipe with algorithm.name=METHOD (e.g. countdown); "
        "default: each method's own recipe, or its preset over grpo",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="a named set of overrides: every method runs once per variant (repeatable), "
        "e.g. --variant stale0:rollout.staleness=0 --variant stale2:rollout.staleness=2",
    )
    p.add_argument(
        "--baseline",
        default=None,
        help="the cell (METHOD or METHOD@VARIANT) the report pairs every other cell "
        "against, seed by seed; default: the first",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="parallel worker processes of one thread each (1: the runs one after another "
        "in this process, with the recipe's threads)",
    )
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run each run as a Ray task of one CPU on the cluster at ADDRESS ('local': a "
        "cluster started here); the nodes must share the output folder",
    )
    p.set_defaults(func=run_compare, overrides=[])


def run_compare(args: argparse.Namespace) -> int:
    from policyopt.cli.study import merge_variants, parse_variant, plan

    console = Console()
    names = [r for r in args.recipes if "=" not in r]
    overrides = [r for r in args.recipes if "=" in r] + args.overrides
    root = Path(args.output_dir)
    reach = parse_reach(args.reach) if args.reach else None
    if args.reach_window < 1:
        raise ValueError(f"--reach-window must be >= 1, got {args.reach_window}")
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    variants = merge_variants([parse_variant(v) for v in args.variant])
    # One SFT warm start for all seeds (the SFT cache keys on its seed): seeds then vary the
    # RL phase only, and N seeds cost one SFT, not N. A train.sft_seed given later wins.
    runs = plan(
        names,
        args.seeds,
        root,
        ["train.sft_seed=0", *overrides, f"eval.samples={args.samples}"],
        recipe=args.recipe,
        variants=variants,
        one_thread=args.workers > 1 or args.ray is not None,
    )
    check_runs(runs, args.recipe)
    cells = list(dict.fromkeys(r.cell for r in runs))
    if args.baseline is not None and args.baseline not in cells:  # before any run starts
        raise ValueError(
            f"--baseline {args.baseline!r} is not a cell of the study; cells: {', '.join(cells)}"
        )
    from policyopt.store import run_folder

    # The study's folder is claimed like a run's: its report files are not written over a
    # folder of the user's, nor by two studies at once.
    run_folder.claim(root, "--output-dir")
    try:
        return _run_study(args, console, runs, root, cells, reach)
    finally:
        run_folder.release(root)


def _run_study(
    args: argparse.Namespace,
    console: Console,
    runs: list,
    root: Path,
    cells: list[str],
    reach: tuple[str, float, bool] | None,
) -> int:
    from policyopt.cli.study import execute
    from policyopt.cli.study_report import write_report

    status = execute(
        runs,
        workers=args.workers,
        ray_address=args.ray,
        on_done=lambda run, state: console.print(f"{run.cell} seed {run.seed}: {state}"),
        cli=getattr(args, "cli_main", None),
    )
    baseline = args.baseline or cells[0]
    write_report(runs, status, root, baseline=baseline, study_command=study_command(args))
    failed = {k: v for k, v in status.items() if v.startswith("failed")}
    for folder, state in failed.items():
        console.print(f"[red]{folder}: {state}; see {folder}/run.log[/red]")
    summaries: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.finished():
            summaries.setdefault(run.cell, []).append(
                json.loads((run.out / "summary.json").read_text())
            )
    if not summaries:
        console.print("no run finished: nothing to compare")
        return 1
    rows = summarise(summaries)
    if reach is not None:
        metric, value, relative = reach
        target = f"first mean {value:+g}" if relative else f"{value:g}"
        column = f"steps to {metric} >= {target} ({args.reach_window}-step mean)"
        for row in rows:
            steps = [
                steps_to_reach(
                    read_metrics(run.out / "metrics.jsonl"), *reach, window=args.reach_window
                )
                for run in runs
                if run.cell == row["method"] and run.finished()
            ]
            row[column] = reach_summary(steps)
    report = {"rows": rows, "runs": summaries}
    (root / "compare.json").write_text(json.dumps(finite(report), indent=2, allow_nan=False))
    (root / "compare.md").write_text(markdown_table(rows, args.seeds))
    plot_compare(rows, summaries, root / "compare.png")
    console.print(rich_table(rows, args.seeds))
    console.print(
        f"table: {root / 'compare.md'}  plot: {root / 'compare.png'}  report: {root / 'report.md'}"
    )
    return 1 if failed else 0


def study_command(args: argparse.Namespace) -> str:
    """The `policyopt compare` command that runs (or resumes) this study."""
    import shlex

    words = [r for r in args.recipes if "=" not in r]
    words += ["--seeds", str(args.seeds), "--samples", str(args.samples)]
    words += ["--output-dir", str(args.output_dir)]
    for flag in ("recipe", "baseline", "ray", "reach"):
        if getattr(args, flag) is not None:
            words += [f"--{flag}", str(getattr(args, flag))]
    if args.reach is not None:
        words += ["--reach-window", str(args.reach_window)]
    if args.workers != 1:
        words += ["--workers", str(args.workers)]
    for v in args.variant:
        words += ["--variant", v]
    words += [r for r in args.recipes if "=" in r] + list(args.overrides)
    return "policyopt compare " + shlex.join(words)


def check_runs(runs: list, recipe: str | None) -> None:
    """Every cell's config loads (names, overrides) before any run starts."""
    from policyopt.recipes import recipe_config

    seen = set()
    for run in runs:
        if run.cell in seen:
            continue
        seen.add(run.cell)
        extra = [a for a in run.args if "=" in a and not a.startswith("-")]
        recipe_config(recipe or run.method, extra, None, None)


def parse_reach(spec: str) -> tuple[str, float, bool]:
    """`METRIC=VALUE` -> (metric, value, False); `METRIC=+VALUE` -> (metric, value, True)."""
    metric, sep, value = spec.rpartition("=")
    relative = value.startswith("+")
    try:
        threshold = float(value)
    except ValueError:
        threshold = math.nan
    if not sep or not metric or not math.isfinite(threshold):
        raise ValueError(
            f"--reach wants METRIC=VALUE with a number, e.g. reward/mean=0.5; got {spec!r}"
        )
    return metric, threshold, relative


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The run's training log (a line torn by a kill mid-append is skipped)."""
    from policyopt.store.metrics_log import read_metrics as read_log

    if not path.exists():
        raise FileNotFoundError(f"--reach needs the run's training log {path}")
    return read_log(path)


def steps_to_reach(
    records: list[dict[str, Any]],
    metric: str,
    value: float,
    relative: bool = False,
    window: int = 10,
) -> int | None:
    """The first step whose trailing `window`-step mean of `metric` is >= `value` (with
    `relative`, >= the first such mean + `value`); only steps that logged the metric count.
    None if the run never got there."""
    seen: list[float] = []
    first: float | None = None
    for record in records:
        if metric not in record:
            continue
        seen.append(float(record[metric]))
        if len(seen) < window:
            continue
        mean = sum(seen[-window:]) / window
        if first is None:
            first = mean
        if mean >= (first + value if relative else value):
            return int(record["step"])
    return None


def reach_summary(steps: list[int | None]) -> tuple[float, float] | str:
    """Mean and CI of the steps when every run reached the threshold; otherwise a note with
    the runs that did (their mean) and how many did not."""
    done = [s for s in steps if s is not None]
    if len(done) == len(steps):
        return mean_ci([float(s) for s in done])
    if not done:
        return f"not reached (0/{len(steps)})"
    return f"{sum(done) / len(done):.1f} over {len(done)}/{len(steps)} runs; the rest never"


def metric_keys(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The eval metrics every run has (runs evaluated with different sample counts share
    their smaller set of pass@k), in the first run's order."""
    summaries = [s for group in runs.values() for s in group]
    common = set.intersection(*(set(s["final_eval"]) for s in summaries))
    return [k for k in summaries[0]["final_eval"] if k.startswith("eval/") and k in common]


def summarise(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for name, summaries in runs.items():
        row: dict[str, Any] = {"method": name, "seeds": len(summaries)}
        for key in metric_keys(runs):
            row[key.removeprefix("eval/")] = mean_ci([s["final_eval"][key] for s in summaries])
        row["initial accuracy"] = mean_ci([s["initial_accuracy"] for s in summaries])
        # Paired over seeds (seeds that share one SFT start have one initial accuracy): the
        # RL effect itself.
        row["accuracy gain"] = mean_ci(
            [s["final_accuracy"] - s["initial_accuracy"] for s in summaries]
        )
        row["RL wall time (s)"] = mean_ci([s["rl_seconds"] for s in summaries])
        rows.append(row)
    return rows


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None: JSON has no NaN (a bare NaN in
    compare.json breaks strict parsers, jq and JavaScript)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def metric_range(name: str) -> tuple[float, float] | None:
    """The values a compared metric can take, where bounded: shares of problems (accuracy,
    pass@k, avg@k, maj@k) lie in [0, 1], a gain in accuracy in [-1, 1], a time is >= 0."""
    if name.startswith(("accuracy", "initial accuracy", "pass@", "avg@", "maj@")):
        return (-1.0, 1.0) if name == "accuracy gain" else (0.0, 1.0)
    if name.endswith("(s)"):
        return (0.0, math.inf)
    return None


def interval(v: tuple[float, float], name: str) -> tuple[float, float, bool]:
    """(low, high, clipped): the 95% interval mean ± half, clipped to the metric's range (a
    Student-t interval over 2-3 seeds can reach far past 0 and 1)."""
    mean, half = v
    low, high = mean - half, mean + half
    bounds = metric_range(name)
    if bounds is None or not math.isfinite(half):
        return low, high, False
    clipped = (max(low, bounds[0]), min(high, bounds[1]))
    return clipped[0], clipped[1], clipped != (low, high)


CLIP_NOTE = (
    "An interval that reaches past a metric's range (accuracy and pass@k lie in [0, 1]) is "
    "clipped to it and shown as [low, high]."
)


def _fmt(v: tuple[float, float] | str, name: str = "") -> str:
    if isinstance(v, str):
        return v
    mean, half = v
    if not math.isfinite(half):
        return f"{mean:.3f}"
    low, high, clipped = interval(v, name)
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]" if clipped else f"{mean:.3f} ± {half:.3f}"


def markdown_table(rows: list[dict[str, Any]], seeds: int) -> str:
    cols = [k for k in rows[0] if k not in ("method", "seeds")]
    head = "| method | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n"
    body = "".join(
        "| " + r["method"] + " | " + " | ".join(_fmt(r[c], c) for c in cols) + " |\n" for r in rows
    )
    return f"Mean ± 95% CI (Student t) over {seeds} seeds. {CLIP_NOTE}\n\n" + head + body


def rich_table(rows: list[dict[str, Any]], seeds: int) -> Table:
    """One row per metric, one column per method: fits 80 columns for up to four methods
    (a column per metric did not fit a terminal)."""
    cols = [k for k in rows[0] if k not in ("method", "seeds")]
    table = Table(title=f"mean ± 95% CI over {seeds} seeds", caption=CLIP_NOTE)
    table.add_column("metric", overflow="fold")
    for r in rows:
        table.add_column(r["method"], justify="right")
    for c in cols:
        table.add_row(c, *(_fmt(r[c], c) for r in rows))
    return table


def plot_compare(
    rows: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]], path: Path
) -> None:
    """Left: accuracy and pass@k bars with CIs; right: each method's pass@k curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in rows[0] if k.startswith(("accuracy", "pass@", "avg@", "maj@"))]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        xs = [j + i * width for j in range(len(keys))]
        means = [r[k][0] for k in keys]
        spans = [interval(r[k], k) for k in keys]  # clipped to [0, 1]: no bar past the range
        left.bar(
            xs,
            means,
            width,
            yerr=[
                [
                    0 if math.isnan(lo) else m - lo
                    for m, (lo, _, _) in zip(means, spans, strict=True)
                ],
                [
                    0 if math.isnan(hi) else hi - m
                    for m, (_, hi, _) in zip(means, spans, strict=True)
                ],
            ],
            label=r["method"],
            capsize=3,
        )
        curve = sorted((int(k.split("@")[1]), r[k][0]) for k in keys if k.startswith("pass@"))
        if curve:
            right.plot([c[0] for c in curve], [c[1] for c in curve], marker="o", label=r["method"])
    left.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], keys, rotation=30)
    left.set_title("held-out metrics (mean, 95% CI clipped to [0, 1])")
    left.legend()
    right.set_xscale("log", base=2)
    right.set_xlabel("k")
    right.set_title("pass@k")
    right.grid(alpha=0.3)
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
