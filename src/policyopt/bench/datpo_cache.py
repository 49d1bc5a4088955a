"""What reusing the bases' KV cache saves when DATPO forks (`python -m
policyopt.bench.datpo_cache`).

Samples base rollouts once (`HFEngine.generate_with_cache`), picks fork points (K per base,
uniformly among the response positions, seeded), then times the branch phase both ways on
the same forks: `branches_from_cache` (one token fed per fork) and `sample_branches` (each
fork's prompt + prefix prefilled once). The two arms alternate (A B, B A, ...), each with
the same sampling seed, and the first round is a warm-up. Reported: median wall and CPU
seconds of each arm, their ratios (recompute / reuse), and the prefix tokens each arm runs
through the model. Absolute times on a shared machine are noisy; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch

from policyopt.models.loading import load_model
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.hf_engine import HFEngine
from policyopt.rollout.tree import branches_from_cache, sample_branches


def run(
    model_name: str,
    prompts: int,
    n_base: int,
    forks: int,
    branches: int,
    max_new_tokens: int,
    rounds: int,
    seed: int,
    context_words: int = 0,
) -> dict[str, Any]:
    model, tok = load_model(model_name)
    engine = HFEngine(model, tok, generator=torch.Generator().manual_seed(seed))
    # An optional preamble of `context_words` words stands for a long problem statement or
    # document: the longer the prefix, the more a prefill costs.
    preamble = " ".join(["note"] * context_words) + "\n" if context_words else ""
    texts = [f"{preamble}(({i}+{2 * i + 3})-{i % 5})+{i + 7}=?" for i in range(prompts)]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    base_prompts = [p for p in ids for _ in range(n_base)]
    params = SamplingParams(max_new_tokens=max_new_tokens)
    base, kept = engine.generate_with_cache(base_prompts, params)
    rng = random.Random(seed)
    rows, at = [], []
    for r in range(len(base)):
        length = int(base.lengths[r])
        for t in sorted(rng.sample(range(1, length), min(forks, length - 1))):
            rows.append(r)
            at.append(t)
    budgets = [max_new_tokens - t for t in at]
    count = [branches] * len(rows)
    prefixes = [
        base_prompts[r] + base.response_ids[r, :t].tolist() for r, t in zip(rows, at, strict=True)
    ]

    def reuse() -> int:
        engine.generator = torch.Generator().manual_seed(seed + 1)
        out = branches_from_cache(engine, kept, base, rows, at, budgets, count, params)
        return out.generated_tokens

    def recompute() -> int:
        engine.generator = torch.Generator().manual_seed(seed + 1)
        out = sample_branches(engine, prefixes, budgets, count, params)
        return out.generated_tokens

    arms = {"reuse": reuse, "recompute": recompute}
    wall: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    generated: dict[str, int] = {}
    for round_ in range(rounds + 1):
        order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
        for name in order:
            w0, c0 = time.perf_counter(), time.process_time()
            generated[name] = arms[name]()
            if round_ > 0:  # round 0 warms up
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "model": model_name,
        "mean_prompt_tokens": sum(map(len, ids)) / len(ids),
        "bases": len(base),
        "forks": len(rows),
        "branches": sum(count),
        "mean_base_length": float(base.lengths.float().mean()),
        "mean_fork_position": sum(at) / len(at),
        "prefix_tokens_prefilled": {"reuse": 0, "recompute": sum(map(len, prefixes))},
        "tokens_fed_at_forks": {"reuse": len(rows), "recompute": 0},
        "generated_tokens": generated,
        "wall_s_median": med,
        "cpu_s_median": med_cpu,
        "wall_ratio_recompute_over_reuse": med["recompute"] / med["reuse"],
        "cpu_ratio_recompute_over_reuse": med_cpu["recompute"] / med_cpu["reuse"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n-base", type=int, default=4)
    p.add_argument("--forks", type=int, default=2, help="fork points per base (K)")
    p.add_argument("--branches", type=int, default=4, help="branches per fork (B)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--context-words", type=int, default=0, help="words of preamble per prompt")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run(
        args.model,
        args.prompts,
        args.n_base,
        args.forks,
        args.branches,
        args.max_new_tokens,
        args.rounds,
        args.seed,
        args.context_words,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
