"""The LM reranker over RL steps: SRPO's advantage against GRPO's on the `rerank` task.

For each (seed, method) the `rerank_srpo` recipe (with the given overrides) warm-starts the
embedded tiny LM by SFT (cached; one SFT per seed, shared by both methods), evaluates it
greedily on the held-out queries, trains `train.steps` RL steps with `algorithm.advantage`
= srpo or grpo (everything else equal: the same SFT model, data, sampling seed, token clip,
the ranking_distances shaper), evaluating every `eval.every` steps, and appends one JSON
line to `--out`: the held-out curve of NDCG@k of the parsed rankings (unparseable = 0,
the task's reward), NDCG@k among the parsed ones, the parse rate (a completion naming at
least one candidate) and the complete rate (all candidates named once). A (seed, method)
already in the file is skipped; none starts after `--max-seconds`.

    python -m studies.srpo.rerank_study --out studies/srpo/data/rerank.jsonl --seeds 0,1 \\
        train.steps=20 rollout.prompts_per_step=8
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from policyopt.config.load import load_config
from policyopt.pipelines.quickstart import warm_started_policy
from policyopt.recipes import recipe_dict
from policyopt.store.metrics_log import read_metrics
from policyopt.train.trainer import Trainer

COMMON = [
    "train.num_threads=1",
    "train.loggers=[jsonl]",
    "train.progress=false",
    "train.plot=false",
    "train.save_every=0",
    "train.resume=null",
]
KEYS = ("eval/reward", "eval/parse_rate", "eval/complete_rate", "eval/ndcg_parsed")


def run_one(method: str, seed: int, overrides: list[str], console: Console) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        extra = [
            *COMMON,
            f"train.output_dir={tmp}",
            f"train.seed={seed}",
            f"algorithm.advantage={method}",
            *overrides,
        ]
        config = load_config(None, extra, base=recipe_dict("rerank_srpo"))
        start = time.perf_counter()
        model, tok, sft = warm_started_policy(config, console)
        t_sft = time.perf_counter() - start
        trainer = Trainer(config, model=model, tokenizer=tok, console=console)
        try:
            first = trainer.evaluate()
            trainer.train()
            if trainer.step % max(config.eval.every, 1) or not config.eval.every:
                final = trainer.evaluate()
            else:
                final = None
        finally:
            trainer.close()
        records = read_metrics(Path(tmp) / "metrics.jsonl")
    curve = [(0, *(first[k] for k in KEYS))]
    curve += [(r["step"], *(r[k] for k in KEYS)) for r in records if "eval/reward" in r]
    if final is not None:
        curve.append((trainer.step, *(final[k] for k in KEYS)))
    train_rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    unparseable = [r["unparseable"] / r["leaves"] for r in records if "unparseable" in r]
    # SRPO's own advantage metrics (srpo runs only): how far its advantage is from GRPO's.
    mechanism = {
        f"{key}_mean": _mean([r[key] for r in records if key in r])
        for key in ("srpo/corr_grpo", "srpo/saturation", "srpo/zero_distance_pairs")
    }
    return {
        "method": method,
        "seed": seed,
        "overrides": overrides,
        "steps": trainer.step,
        "curve_keys": ["step", *KEYS],
        "curve": curve,
        "before": dict(zip(KEYS, curve[0][1:], strict=True)),
        "after": dict(zip(KEYS, curve[-1][1:], strict=True)),
        "train_reward_first5": _mean(train_rewards[:5]),
        "train_reward_last5": _mean(train_rewards[-5:]),
        "train_unparseable_first5": _mean(unparseable[:5]),
        "train_unparseable_last5": _mean(unparseable[-5:]),
        **mechanism,
        "sft": sft,
        "sft_seconds": t_sft,
        "wall_s": time.perf_counter() - start,
    }


def _mean(values: list[Any]) -> float | None:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--methods", default="srpo,grpo")
    p.add_argument("--max-seconds", type=float, default=420.0)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        done = {
            (r["method"], r["seed"], tuple(r["overrides"]))
            for r in map(json.loads, filter(str.strip, out.read_text().splitlines()))
        }
    console = Console(stderr=True)
    start = time.perf_counter()
    for seed in (int(s) for s in args.seeds.split(",") if s):
        for method in filter(None, args.methods.split(",")):
            if (method, seed, tuple(args.overrides)) in done:
                continue
            if time.perf_counter() - start > args.max_seconds:
                print("out of time")
                return 0
            r = run_one(method, seed, list(args.overrides), console)
            with out.open("a") as f:
                f.write(json.dumps(r) + "\n")
            b, a = r["before"], r["after"]
            print(
                f"{method} seed={seed} steps={r['steps']} NDCG {b['eval/reward']:.3f} -> "
                f"{a['eval/reward']:.3f}, parse {b['eval/parse_rate']:.3f} -> "
                f"{a['eval/parse_rate']:.3f}, parsed NDCG {b['eval/ndcg_parsed']:.3f} -> "
                f"{a['eval/ndcg_parsed']:.3f} ({r['wall_s']:.0f}s, SFT {r['sft_seconds']:.0f}s)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
