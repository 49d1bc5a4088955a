"""The DMRL deployment loop with the scripted editor instead of a trained LM (a baseline).

    python -m studies.dmrl.scripted --lrp DIR [--seed 0] [--days 30] [--edits 16]

Each day the scripted editor (the SFT demonstrator: random well-formed edits) proposes
`--edits` candidates; the `dmrl_lrp` reward function A/B-tests them and the environment
deploys the best predicted one above the margin. Prints, every 5 days, the true 7-day value
per user of the deployed configuration (fixed evaluation users) relative to the start.
DIR is a trained LRP (`<quickstart output>/lrp`).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from policyopt.envs.ads.reward import LRPReward
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT, scripted_edit
from policyopt.tasks.base import get_task


def climb(lrp: str, seed: int, days: int, edits: int) -> list[tuple[int, float, int]]:
    """(day, relative value, deployments so far) every 5 days and at the end."""
    task = get_task(
        "dmrl_skill", seed=seed, users_per_arm=300, eval_users=1000, first_day=100, lrp_path=lrp
    )
    rng = np.random.default_rng(seed)
    reward = LRPReward(task)
    start = task.value(START_DOCUMENT)
    out = []
    for day in range(1, days + 1):
        texts = [scripted_edit(task.env.document, rng).text() + "\n" for _ in range(edits)]
        reward(["p"] * edits, texts)
        task.end_of_round()
        if day % 5 == 0 or day == days:
            rel = task.value(task.env.document) / start - 1
            out.append((day, rel, len(task.env.deployed_days)))
            print(f"day {day}: {rel * 100:+.2f}% ({len(task.env.deployed_days)} deployed)")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lrp", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--edits", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    climb(args.lrp, args.seed, args.days, args.edits)


if __name__ == "__main__":
    main()
