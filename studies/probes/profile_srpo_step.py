"""Where an SRPO step's extra time over a GRPO step goes (issue 21, item 6).

The bench's SRPO setting (pl-mlp on ltr_synthetic, 16 prompts x 8), both arms built as
`policyopt bench` builds them and stepped in ABBA order, each step under its arm's own
cProfile; prints the functions whose cumulative time per step differs most between the arms.
The profiler inflates Python-heavy code: read the split, take the ratio from `policyopt bench`.

    python studies/probes/profile_srpo_step.py [ROUNDS]
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch

from policyopt.cli.bench import PolicyoptArms
from policyopt.store.checkpoint import rng_state, set_rng_state

SETTINGS = {
    "prompts_per_step": 16,
    "group_size": 8,
    "max_new_tokens": 10,
    "lr": 1e-5,
    "model": "pl-mlp",
    "temperature": 1.0,
}
OVERRIDES = ["task.name=ltr_synthetic", "rollout.engine=pl", "eval.size=0", "train.num_threads=1"]
WARMUP = 5


def per_function(profile: cProfile.Profile) -> dict[str, tuple[float, float]]:
    """function -> (cumulative seconds, calls)."""
    out = {}
    for (path, line, name), (_, calls, _, cum, _) in pstats.Stats(profile).stats.items():
        out[f"{path.split('site-packages/')[-1].split('src/')[-1]}:{line}({name})"] = (cum, calls)
    return out


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    arms = PolicyoptArms(["grpo", "srpo"], SETTINGS, rounds + WARMUP, OVERRIDES)
    profiles = {a: cProfile.Profile() for a in arms.algos}
    wall: dict[str, list[float]] = {a: [] for a in arms.algos}
    try:
        for r in range(rounds + WARMUP):
            for algo in arms.algos if r % 2 == 0 else arms.algos[::-1]:
                trainer = arms.trainers[algo]
                set_rng_state(arms.rng[algo])
                measured = r >= WARMUP
                start = time.perf_counter()
                if measured:
                    profiles[algo].enable()
                trainer.run_step()
                if measured:
                    profiles[algo].disable()
                    wall[algo].append(time.perf_counter() - start)
                arms.rng[algo] = rng_state()
    finally:
        arms.close()
    for algo in arms.algos:
        print(f"{algo}: median step {1e3 * statistics.median(wall[algo]):.2f} ms (profiled)")
    grpo, srpo = per_function(profiles["grpo"]), per_function(profiles["srpo"])
    rows = []
    for key in grpo.keys() | srpo.keys():
        (g, _), (s, _) = grpo.get(key, (0.0, 0)), srpo.get(key, (0.0, 0))
        rows.append((s - g, g, s, key))
    print("ms per step: srpo - grpo, grpo, srpo (cumulative), function")
    for diff, g, s, key in sorted(rows, reverse=True)[:30]:
        print(f"{1e3 * diff / rounds:7.3f} {1e3 * g / rounds:8.3f} {1e3 * s / rounds:8.3f}  {key}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
