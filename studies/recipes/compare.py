"""Two arms of `headlines.py` runs over the same seeds: each arm's before, after and gain
(mean ± 95% half-width), and the paired difference of the two arms with its minimum
detectable effect (studies/README.md: MDE = (t.975 + t.80) · s / √n, paired, n − 1 df).

    python -m studies.recipes.compare studies/recipes/data/grpo_precision.jsonl \\
        --a "" --b model.precision=bf16-mixed

An arm is the runs whose overrides (train.num_threads aside) are exactly the given
space-separated KEY=VALUE list ("" for the recipe as shipped); --a-file/--b-file read an arm
from another file.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from scipy import stats

from policyopt.core.stats import mean_ci


def arm(path: Path, overrides: str) -> dict[int, dict[str, Any]]:
    """seed -> row, for the runs of `path` with exactly these overrides (rc 0 only)."""
    want = sorted(overrides.split())
    rows = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        own = sorted(o for o in r["overrides"] if not o.startswith("train.num_threads="))
        if own == want and r["rc"] == 0:
            rows[r["seed"]] = r
    return rows


def mde(diffs: list[float]) -> float:
    n = len(diffs)
    if n < 2:
        return float("nan")
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    return (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.80, n - 1)) * sd / math.sqrt(n)


def line(name: str, values: list[float]) -> str:
    mean, half = mean_ci(values)
    per_seed = ", ".join(f"{v:+.3f}" if name.endswith("gain") else f"{v:.3f}" for v in values)
    return f"{name}: {mean:.3f} ± {half:.3f} ({per_seed})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--a", default="")
    parser.add_argument("--b", required=True)
    parser.add_argument("--a-file", type=Path, default=None)
    parser.add_argument("--b-file", type=Path, default=None)
    parser.add_argument("--key", default="after", help="the paired quantity: before or after")
    args = parser.parse_args(argv)
    a = arm(args.a_file or args.file, args.a)
    b = arm(args.b_file or args.file, args.b)
    seeds = sorted(set(a) & set(b))
    print(f"seeds {seeds}")
    for label, runs in (("A " + (args.a or "as shipped"), a), ("B " + args.b, b)):
        print(label)
        for key in ("before", "after"):
            print("  " + line(key, [runs[s][key] for s in seeds]))
        print("  " + line("gain", [runs[s]["after"] - runs[s]["before"] for s in seeds]))
    diffs = [b[s][args.key] - a[s][args.key] for s in seeds]
    mean, half = mean_ci(diffs)
    print(f"B − A, {args.key}, paired: {mean:+.3f} ± {half:.3f}, MDE {mde(diffs):.3f}")
    gains = [(b[s]["after"] - b[s]["before"]) - (a[s]["after"] - a[s]["before"]) for s in seeds]
    mean, half = mean_ci(gains)
    print(f"B − A, gain, paired: {mean:+.3f} ± {half:.3f}, MDE {mde(gains):.3f}")


if __name__ == "__main__":
    main()
