"""`policyopt bench`: step time of methods side by side in one process (and TRL's).

Every method runs on the same tiny model, prompts, group size, lengths and optimizer; the
first step of each (warm-up) is excluded and the median of the rest is reported. Absolute
times on a shared machine are noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="step time of methods (and TRL) side by side")
    p.add_argument("--algos", default="grpo", help="comma-separated presets, e.g. grpo,dapo")
    p.add_argument("--against", choices=["trl"], default=None, help="also time TRL's GRPOTrainer")
    p.add_argument("--steps", type=int, default=5, help="measured steps (after one warm-up)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--model", default="tiny")
    p.add_argument("--memory", action="store_true", help="also measure the chunked LM-head memory")
    p.add_argument("--json-out", default=None)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="applied to every method")
    p.set_defaults(func=run_bench)


def bench_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "prompts_per_step": args.prompts,
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "lr": 1e-5,
        "model": args.model,
        "temperature": 1.0,
    }


def time_policyopt(
    algo: str, settings: dict[str, Any], steps: int, overrides: list[str]
) -> dict[str, Any]:
    from policyopt.trainer.config import load_config
    from policyopt.trainer.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        config = load_config(
            None,
            [
                f"algorithm.name={algo}",
                f"model.name_or_path={settings['model']}",
                f"rollout.prompts_per_step={settings['prompts_per_step']}",
                f"rollout.group_size={settings['group_size']}",
                f"rollout.max_new_tokens={settings['max_new_tokens']}",
                f"rollout.temperature={settings['temperature']}",
                f"optim.lr={settings['lr']}",
                f"train.steps={steps + 1}",
                f"train.output_dir={out}",
                "train.loggers=[jsonl]",
                "train.progress=false",
                "train.plot=false",
                "train.log_samples=0",
                "train.micro_batch_size=64",
                *overrides,
            ],
        )
        trainer = Trainer(config)
        records = [trainer.train_step() for _ in range(steps + 1)][1:]  # drop warm-up
        trainer.close()
    step_times = [r["time/step"] for r in records]
    tokens = [r["generated_tokens"] for r in records]
    # Leaves (rollouts) actually sampled: prompts x group size for parallel sampling, but a
    # tree's leaf count varies with difficulty (DATPO).
    leaves = sum(r["leaves"] for r in records)
    return {
        "step_time_s": statistics.median(step_times),
        "tokens_per_s": sum(tokens) / sum(step_times),
        "generated_tokens_per_leaf": sum(tokens) / leaves,
        "wall_time_per_leaf_s": sum(step_times) / leaves,
        "leaves_per_step": leaves / len(records),
        "time_split": {
            k: statistics.median(r[f"time/{k}"] for r in records)
            for k in ("generation", "scoring", "training")
        },
    }


def run_bench(args: argparse.Namespace) -> int:
    console = Console()
    settings = bench_settings(args)
    results: dict[str, dict[str, Any]] = {}
    for algo in [a.strip() for a in args.algos.split(",") if a.strip()]:
        console.print(f"timing {algo} ...")
        results[algo] = time_policyopt(algo, settings, args.steps, args.overrides)
    if args.against == "trl":
        from policyopt.cli.bench_trl import time_trl

        console.print("timing TRL GRPOTrainer ...")
        results["trl"] = time_trl(settings, args.steps)
    report: dict[str, Any] = {
        "step_time_s": {k: v["step_time_s"] for k, v in results.items()},
        "tokens_per_s": {k: v["tokens_per_s"] for k, v in results.items()},
        "generated_tokens_per_leaf": {
            k: v["generated_tokens_per_leaf"] for k, v in results.items()
        },
        "wall_time_per_leaf_s": {
            k: v["wall_time_per_leaf_s"] for k, v in results.items() if "wall_time_per_leaf_s" in v
        },
        "leaves_per_step": {
            k: v["leaves_per_step"] for k, v in results.items() if "leaves_per_step" in v
        },
        "time_split_s": {k: v["time_split"] for k, v in results.items() if "time_split" in v},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "settings": {**settings, "measured_steps": args.steps},
    }
    base = next(iter(results))
    report["step_time_ratio_to_" + base] = {
        k: v["step_time_s"] / results[base]["step_time_s"] for k, v in results.items()
    }
    report["generated_tokens_per_leaf_ratio_to_" + base] = {
        k: v["generated_tokens_per_leaf"] / results[base]["generated_tokens_per_leaf"]
        for k, v in results.items()
    }
    if "trl" in results:
        report["step_time_ratio_to_trl"] = {
            k: v["step_time_s"] / results["trl"]["step_time_s"] for k, v in results.items()
        }
    if args.memory:
        from policyopt.models.memory_bench import head_memory_benchmark

        report["lm_head_memory"] = head_memory_benchmark()
    text = json.dumps(report, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text)
    console.print_json(text)
    return 0
