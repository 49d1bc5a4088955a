"""The editor study's learning curve in blocks (issue 20): per arm, the proposals' true 7-day
lift minus that of the paired random edits, averaged over each block of days, then mean ±
95% t over seeds; the last column is the run's second half.

    python studies/dmrl/blocks.py --study studies/dmrl/data/editor120 --block 20
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from policyopt.core.stats import mean_ci
from studies.dmrl.editor_study import ARMS
from studies.dmrl.editor_study import days as day_records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", default=str(Path(__file__).parent / "data" / "editor120"))
    p.add_argument("--block", type=int, default=20, help="days per block")
    args = p.parse_args()
    study = Path(args.study)
    for arm in ARMS:
        seeds = [
            int(d.name[4:])
            for d in sorted((study / arm).glob("seed*"))
            if (d / "summary.json").exists()
        ]
        if not seeds:
            continue
        rows = []
        for seed in seeds:
            log = day_records(study, arm, seed)
            x = np.array([r["true_lift"] - r["random_true_lift"] for r in log]) * 100
            blocks = [x[i : i + args.block].mean() for i in range(0, len(x), args.block)]
            rows.append([*blocks, x[len(x) // 2 :].mean()])
        cells = [mean_ci(col.tolist()) for col in np.array(rows).T]
        print(f"{arm:13s} n={len(seeds)} " + " ".join(f"{m:+.2f}±{h:.2f}" for m, h in cells))


if __name__ == "__main__":
    main()
