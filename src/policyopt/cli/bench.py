"""`policyopt bench`: step time of methods side by side in one process (and TRL's).

An arm is a preset name, optionally with overrides of its own after `+`:
`--algos docpo,docpo+reward.prefetch=false+train.seed=1` times DocPO with and without the
early start of its rewards (a different seed, so that the second arm does not find the
first one's rollouts already scored in the reward's cache).

Every method runs on the same model, prompts, group size, lengths and optimizer. Their steps
are interleaved (round 1: A then B; round 2: B then A; ...), each trainer with its own RNG
state, so that every method samples what it would alone while load drift on a shared machine
hits all of them alike. The first round (warm-up) is excluded. Reported per method: the
median step time; the median CPU time of the process per step (all threads; on a loaded CPU
machine it measures the work a method adds without the waiting, most cleanly with
`train.num_threads=1`; it misses GPU time); and, relative to the first method, the ratio of
the medians and the median of per-round ratios (`step_time_paired_ratio_to_<first>`).
Absolute times on a shared machine are noisy: compare the ratios.

`--against trl` adds TRL's `GRPOTrainer` on the same model, prompts, lengths and optimizer,
interleaved too: after each of its steps one round of the methods runs (outside TRL's timing,
TRL's RNG state put back), so that the ratios to TRL (of the medians, of CPU times, and the
median of per-round ratios) are taken under the same load.

`--model` is the start: the untrained embedded tiny model by default, or any name or path
`load_model` accepts, e.g. an SFT checkpoint (`policyopt sft --output-dir DIR`, or the
pipeline's cache `~/.cache/policyopt/sft/<key>/`) or a training checkpoint folder. Methods
whose cost depends on correct rollouts (GAR) need a trained start: the report's
`fraction_correct` says how many rollouts passed the verifier. The task is the config's
default (the embedded arithmetic task, as in the recipes) unless an override sets it.

`--background-load N` runs the same bench a second time with N competing CPU-bound
processes (`policyopt.bench.background_load`: a torch matmul loop on `--load-threads`
threads each, torch's default spinning OpenMP pool) that the bench starts and stops itself
(also on an error or Ctrl-C); the report holds the quiet run and, under `background_load`,
the loaded one beside it, with the ratios to TRL of both.

`--ci-width W` (without `--against`): instead of `--steps` rounds, rounds are repeated until
every arm's 95% interval of its mean paired ratio to the first arm is at most W wide (e.g.
0.03 for a 3% overhead target), after at least `--steps` and at most `--max-rounds`
rounds; `ratio_interval_to_<first>` reports each interval, its rounds and whether it got
narrow enough (`converged`).

Data parallel: run it under torchrun with arms that set `train.parallel`, e.g.
`torchrun --nproc-per-node 2 -m policyopt.cli.main bench --algos grpo+train.parallel=fsdp2`;
`--prompts` is then the global prompts per step. The report's `per_rank` lists, for every
rank, the MiB of parameters, gradients and optimizer state it holds (local shards under
FSDP2) and its peak RSS; step times are the slowest rank's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import tempfile
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console

from policyopt.cli.commands import OVERWRITTEN, write_output

if TYPE_CHECKING:
    from policyopt.config.load import Config


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="step time of methods (and TRL) side by side")
    p.add_argument(
        "--algos",
        default="grpo",
        help="comma-separated arms: presets, each with optional +KEY=VALUE overrides of its "
        "own, e.g. grpo,dapo or docpo,docpo+reward.prefetch=false",
    )
    p.add_argument("--against", choices=["trl"], default=None, help="also time TRL's GRPOTrainer")
    p.add_argument("--steps", type=int, default=5, help="measured steps (after one warm-up)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument(
        "--model",
        default="tiny",
        help="start model: 'tiny' (untrained) or a name/path load_model accepts, e.g. an SFT "
        "checkpoint folder (policyopt sft --output-dir DIR, ~/.cache/policyopt/sft/<key>)",
    )
    p.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="also run the bench with N competing CPU-bound processes, started and stopped by "
        "the bench, and report it beside the quiet run (default: 0, quiet only)",
    )
    p.add_argument(
        "--load-threads", type=int, default=2, help="threads of each competing process (2)"
    )
    p.add_argument(
        "--ci-width",
        type=float,
        default=None,
        metavar="W",
        help="repeat rounds until each arm's 95%% interval of its paired ratio to the first "
        "arm is at most W wide (e.g. 0.03), --steps at least, --max-rounds at most",
    )
    p.add_argument("--max-rounds", type=int, default=60, help="cap for --ci-width (60)")
    p.add_argument("--memory", action="store_true", help="also measure the chunked LM-head memory")
    p.add_argument(
        "--json-out",
        default=None,
        metavar="PATH",
        help=f"also write the JSON report to PATH ({OVERWRITTEN})",
    )
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


def split_arm(arm: str) -> tuple[str, list[str]]:
    """`preset+KEY=VALUE+...` -> (preset, overrides); a `+` inside a value (`1e+5`) that is
    not followed by a letter stays in the value."""
    preset, *overrides = re.split(r"\+(?=[A-Za-z_])", arm)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"bench arm {arm!r}: {item!r} is not KEY=VALUE")
    return preset, overrides


def bench_config(
    algo: str, settings: dict[str, Any], steps: int, overrides: list[str], out: str
) -> Config:
    """The training config of one arm (`split_arm`) under the bench settings; the arm's own
    overrides come last."""
    from policyopt.config.load import load_config

    preset, own = split_arm(algo)
    return load_config(
        None,
        [
            f"algorithm.name={preset}",
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
            *own,
        ],
    )


class PolicyoptArms:
    """One Trainer per arm; `run_round` times one step of each, in ABBA order (round 1: A
    then B; round 2: B then A; ...), each trainer with its own RNG state, so that every arm
    samples what it would alone while load drift on a shared machine hits all alike."""

    def __init__(
        self, algos: list[str], settings: dict[str, Any], steps: int, overrides: list[str]
    ) -> None:
        from policyopt.store.checkpoint import rng_state
        from policyopt.train.trainer import Trainer

        self.algos = algos
        self.records: dict[str, list[dict[str, float]]] = {a: [] for a in algos}
        self._root = tempfile.TemporaryDirectory()
        self.trainers, self.rng = {}, {}
        for algo in algos:  # each Trainer seeds the global RNGs: keep its state apart
            self.trainers[algo] = Trainer(
                bench_config(
                    algo, settings, steps, overrides, f"{self._root.name}/{len(self.trainers)}"
                )
            )
            self.rng[algo] = rng_state()

    def run_round(self, round_: int) -> None:
        from policyopt.store.checkpoint import rng_state, set_rng_state

        order = self.algos if round_ % 2 == 0 else self.algos[::-1]  # ABBA: drift cancels
        for algo in order:
            trainer = self.trainers[algo]
            set_rng_state(self.rng[algo])
            cpu = time.process_time()
            record = trainer.run_step()
            record["cpu/step"] = time.process_time() - cpu
            self.records[algo].append(record)
            self.rng[algo] = rng_state()

    def results(self) -> dict[str, dict[str, Any]]:
        """Per arm: `summarize` of its rounds after the first (warm-up), and per data-parallel
        rank (one entry without torchrun) the state it holds and its peak RSS."""
        out = {algo: summarize(recs[1:]) for algo, recs in self.records.items()}
        for algo, trainer in self.trainers.items():
            out[algo]["per_rank"] = rank_memory(trainer)
            out[algo]["trainable_parameters"] = sum(
                p.numel() for p in trainer.model.parameters() if p.requires_grad
            )
        return out

    def close(self) -> None:
        for trainer in self.trainers.values():
            trainer.close()
        self._root.cleanup()


def rank_memory(trainer: Any) -> list[dict[str, float]]:
    """Every rank's parameter, gradient and optimizer MiB (local shards) and peak RSS."""
    from policyopt.train.distributed import local_state_mb

    mine = {
        **local_state_mb(trainer.model, trainer.optimizer),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    return trainer.dist.gather(mine)


def time_policyopt(
    algos: list[str],
    settings: dict[str, Any],
    steps: int,
    overrides: list[str],
    ci_width: float | None = None,
    max_rounds: int = 60,
) -> dict[str, dict[str, Any]]:
    """Per method: median step time and the rest of `summarize`, steps interleaved; with
    `ci_width`, rounds repeated until the paired ratios' 95% intervals are that narrow
    (`policyopt.bench.stats.repeat_until_narrow`), the intervals under "interval"."""
    from policyopt.bench.stats import repeat_until_narrow

    rounds = max_rounds if ci_width is not None else steps
    arms = PolicyoptArms(algos, settings, rounds, overrides)
    try:
        arms.run_round(0)  # warm-up, not measured
        if ci_width is None:
            for round_ in range(1, steps + 1):
                arms.run_round(round_)
            return arms.results()
        intervals = repeat_until_narrow(
            lambda i: arms.run_round(i + 1),
            lambda: paired_ratios(arms.records),
            width=ci_width,
            min_rounds=max(2, steps),
            max_rounds=max_rounds,
        )
        results = arms.results()
        for algo, interval in intervals.items():
            results[algo]["interval"] = interval
        return results
    finally:
        arms.close()


def paired_ratios(records: dict[str, list[dict[str, float]]]) -> dict[str, list[float]]:
    """Per arm after the first: its step time over the first arm's, round by round
    (the warm-up round left out)."""
    first, *others = records
    base = [r["time/step"] for r in records[first][1:]]
    return {
        algo: [r["time/step"] / b for r, b in zip(records[algo][1:], base, strict=True)]
        for algo in others
    }


def time_with_trl(
    algos: list[str], settings: dict[str, Any], steps: int, overrides: list[str]
) -> dict[str, dict[str, Any]]:
    """`time_policyopt` with TRL's `GRPOTrainer` as one more arm, interleaved too: after each
    TRL step (timed on its own), one round of the policyopt arms runs, on their own RNG
    states (TRL's is put back after it), so that the ratio to TRL is taken under the same
    load, not minutes apart."""
    from policyopt.bench.trl import time_trl

    arms = PolicyoptArms(algos, settings, steps, overrides)
    try:
        trl = time_trl(
            {**settings, **trl_matching(arms.trainers[algos[0]].config)},
            steps,
            between=arms.run_round,
        )
        results = arms.results()
    finally:
        arms.close()
    results["trl"] = trl
    return results


def trl_matching(config: Config) -> dict[str, Any]:
    """What TRL's arm takes from the first policyopt arm's config so that both train the
    same thing: the LoRA adapter (rank, alpha, dropout, target modules) and the precision
    (bf16-mixed: TRL's `bf16=True`, autocast over float32 weights, as ours)."""
    lora = config.model.lora
    return {
        "lora": lora.model_dump() if lora.enabled else None,
        "bf16": config.model.precision == "bf16-mixed",
    }


def summarize(records: list[dict[str, float]]) -> dict[str, Any]:
    """Median step (and CPU) time, throughput, per-leaf costs, time split, fraction
    correct."""
    step_times = [r["time/step"] for r in records]
    tokens = [r["generated_tokens"] for r in records]
    # Leaves (rollouts) actually sampled: prompts x group size for parallel sampling, but a
    # tree's leaf count varies with difficulty (DATPO).
    leaves = sum(r["leaves"] for r in records)
    return {
        "step_times_s": step_times,
        "step_time_s": statistics.median(step_times),
        "cpu_time_s": statistics.median(r["cpu/step"] for r in records),
        "tokens_per_s": sum(tokens) / sum(step_times),
        # Sampling throughput: generated tokens per second of the rollout phase alone.
        "sampling_tokens_per_s": sum(tokens) / sum(r["time/generation"] for r in records),
        "generated_tokens_per_leaf": sum(tokens) / leaves,
        "wall_time_per_leaf_s": sum(step_times) / leaves,
        "leaves_per_step": leaves / len(records),
        "fraction_correct": sum(r["accuracy"] * r["leaves"] for r in records) / leaves,
        # Medians of each phase: sampling, the reward pipeline, the no-grad log-prob passes
        # before the update (behaviour / reference), and the update proper (forward, backward,
        # optimizer step and the engine's weight sync); `training` is the last two together.
        "time_split": {
            **{
                k: statistics.median(r.get(f"time/{k}", 0.0) for r in records)
                for k in ("generation", "scoring", "logprobs", "training")
            },
            # a step whose filters kept no group has no update, hence no time/logprobs
            "update": statistics.median(
                r["time/training"] - r.get("time/logprobs", 0.0) for r in records
            ),
        },
    }


def run_bench(args: argparse.Namespace) -> int:
    # Under torchrun (arms with train.parallel=ddp|fsdp2) every rank runs the arms; rank 0
    # reports, step times being the slowest rank's.
    from policyopt.bench.background_load import BackgroundLoad

    console = Console(quiet=int(os.environ.get("RANK", "0")) > 0)
    if args.ci_width is not None and args.against == "trl":
        raise ValueError(
            "bench: --ci-width repeats policyopt rounds; it cannot be used with "
            "--against trl (TRL's steps are fixed when its trainer starts)"
        )
    if args.background_load < 0:
        raise ValueError(f"bench: --background-load {args.background_load}; give 0 or more")
    settings = bench_settings(args)
    algos = list(dict.fromkeys(a.strip() for a in args.algos.split(",") if a.strip()))
    console.print(f"timing {', '.join(algos)} (interleaved) from {args.model} ...")
    report = bench_report(args, algos, settings, console)
    if args.background_load:
        console.print(
            f"again with {args.background_load} competing CPU-bound processes "
            f"({args.load_threads} threads each) ..."
        )
        with BackgroundLoad(args.background_load, threads=args.load_threads):
            loaded = bench_report(args, algos, settings, console)
        report["background_load"] = {
            "processes": args.background_load,
            "threads_each": args.load_threads,
            **loaded,
        }
    if args.memory:
        from policyopt.bench.head_memory import head_memory_benchmark

        report["lm_head_memory"] = head_memory_benchmark()
    text = json.dumps(report, indent=2)
    if int(os.environ.get("RANK", "0")) > 0:
        return 0
    if args.json_out:
        write_output(args.json_out, text)
    console.print_json(text)
    return 0


def bench_report(
    args: argparse.Namespace, algos: list[str], settings: dict[str, Any], console: Console
) -> dict[str, Any]:
    """One bench of `algos` (and TRL with `--against trl`): times, ratios, memory."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    results: dict[str, dict[str, Any]]
    if args.against == "trl":
        console.print("with TRL's GRPOTrainer interleaved ...")
        results = time_with_trl(algos, settings, args.steps, args.overrides)
    else:
        results = time_policyopt(
            algos, settings, args.steps, args.overrides, args.ci_width, args.max_rounds
        )
    report: dict[str, Any] = {
        "step_time_s": {k: v["step_time_s"] for k, v in results.items()},
        "cpu_time_s": {k: v["cpu_time_s"] for k, v in results.items() if "cpu_time_s" in v},
        "step_times_s": {k: v["step_times_s"] for k, v in results.items() if "step_times_s" in v},
        "tokens_per_s": {k: v["tokens_per_s"] for k, v in results.items()},
        "sampling_tokens_per_s": {
            k: v["sampling_tokens_per_s"]
            for k, v in results.items()
            if "sampling_tokens_per_s" in v
        },
        "generated_tokens_per_leaf": {
            k: v["generated_tokens_per_leaf"] for k, v in results.items()
        },
        "wall_time_per_leaf_s": {
            k: v["wall_time_per_leaf_s"] for k, v in results.items() if "wall_time_per_leaf_s" in v
        },
        "leaves_per_step": {
            k: v["leaves_per_step"] for k, v in results.items() if "leaves_per_step" in v
        },
        "fraction_correct": {
            k: v["fraction_correct"] for k, v in results.items() if "fraction_correct" in v
        },
        "time_split_s": {k: v["time_split"] for k, v in results.items() if "time_split" in v},
        "trainable_parameters": {
            k: v["trainable_parameters"] for k, v in results.items() if "trainable_parameters" in v
        },
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "per_rank": {k: v["per_rank"] for k, v in results.items() if "per_rank" in v},
        "settings": {**settings, "measured_steps": args.steps, "world_size": world},
    }
    base = next(iter(results))
    report["step_time_ratio_to_" + base] = {
        k: v["step_time_s"] / results[base]["step_time_s"] for k, v in results.items()
    }
    report["step_time_paired_ratio_to_" + base] = {
        k: statistics.median(
            t / t0 for t, t0 in zip(v["step_times_s"], results[base]["step_times_s"], strict=True)
        )
        for k, v in results.items()
        if "step_times_s" in v
    }
    report["cpu_time_ratio_to_" + base] = {
        k: v["cpu_time_s"] / results[base]["cpu_time_s"]
        for k, v in results.items()
        if "cpu_time_s" in v
    }
    report["generated_tokens_per_leaf_ratio_to_" + base] = {
        k: v["generated_tokens_per_leaf"] / results[base]["generated_tokens_per_leaf"]
        for k, v in results.items()
    }
    if "trl" in results:
        trl = results["trl"]
        report["trl_settings"] = {
            k: trl[k] for k in ("lora", "bf16", "gradient_checkpointing") if k in trl
        }
        report["step_time_ratio_to_trl"] = {
            k: v["step_time_s"] / trl["step_time_s"] for k, v in results.items()
        }
        report["cpu_time_ratio_to_trl"] = {
            k: v["cpu_time_s"] / trl["cpu_time_s"] for k, v in results.items() if "cpu_time_s" in v
        }
        report["step_time_paired_ratio_to_trl"] = {  # rounds are interleaved with TRL's steps
            k: statistics.median(
                t / t0 for t, t0 in zip(v["step_times_s"], trl["step_times_s"], strict=True)
            )
            for k, v in results.items()
        }
    intervals = {k: v["interval"] for k, v in results.items() if "interval" in v}
    if intervals:
        report["ratio_interval_to_" + base] = intervals
    report["settings"]["measured_steps"] = len(next(iter(results.values()))["step_times_s"])
    return report
