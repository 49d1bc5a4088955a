"""The thread table of studies/record.md ("Threads and load (issue 22)").

Times an SFT step, the sampling and the update of an RL step (GRPO, the embedded arithmetic
task) on a model, for intra-op thread counts, with 0, 1 or 2 competing CPU-bound processes
(`policyopt.cli.background_load`, 2 threads each), and with torch's default OpenMP wait
policy, `OMP_WAIT_POLICY=PASSIVE` or a shorter spin (`--policies spin10000` sets
`GOMP_SPINCOUNT=10000`); libgomp reads them when torch is imported, so every setting runs in
a fresh process.

    python studies/probes/thread_table.py --models tiny,smollm2 --json-out table.jsonl

One JSON line per (model, wait policy, load, threads): median seconds of `--reps` SFT steps,
sampling phases and update phases after one warm-up of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {
    # model: (sft batch, prompts per step, group size, new tokens, lora)
    "tiny": (64, 8, 8, 32, False),
    "smollm2": (4, 2, 2, 8, True),
}


def wait_policy() -> str:
    if "GOMP_SPINCOUNT" in os.environ:
        return "GOMP_SPINCOUNT=" + os.environ["GOMP_SPINCOUNT"]
    return os.environ.get("OMP_WAIT_POLICY", "default")


def child(model: str, loads: list[int], threads: list[int], reps: int) -> None:
    import torch  # before policyopt, which would otherwise set its own GOMP_SPINCOUNT

    from policyopt.bench.background_load import BackgroundLoad
    from policyopt.config.load import SFTConfig, load_config
    from policyopt.train.sft import run_sft
    from policyopt.train.trainer import Trainer

    sft_batch, prompts, group, tokens, lora = SIZES[model]
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(
            None,
            [
                f"model.name_or_path={model}",
                f"model.lora.enabled={str(lora).lower()}",
                f"rollout.prompts_per_step={prompts}",
                f"rollout.group_size={group}",
                f"rollout.max_new_tokens={tokens}",
                f"train.output_dir={out}",
                "train.loggers=[jsonl]",
                "train.progress=false",
                "train.plot=false",
                "train.log_samples=0",
                "train.steps=1000",
                "reward.prefetch=false",
            ],
        )
        trainer = Trainer(cfg)
        sft_cfg = SFTConfig(steps=1, batch_size=sft_batch, warmup_steps=0)

        def measure() -> dict[str, float]:
            sft = run_sft(trainer.model, trainer.tokenizer, trainer.task, sft_cfg, progress=False)
            rec = trainer.run_step()
            return {
                "sft": sft["sft/seconds"],
                "sampling": rec["time/generation"],
                "update": rec["time/training"],
            }

        for load in loads:
            with BackgroundLoad(load, threads=2):
                time.sleep(1.0 if load else 0.0)
                for t in threads:
                    torch.set_num_threads(t)
                    measure()  # warm-up
                    runs = [measure() for _ in range(reps)]
                    line = {
                        "model": model,
                        "wait_policy": wait_policy(),
                        "load": load,
                        "threads": t,
                        **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
                        "load_average_1min": os.getloadavg()[0],
                    }
                    print(json.dumps(line), flush=True)
        trainer.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--policies", default="default,PASSIVE")
    p.add_argument("--loads", default="0,1,2")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json-out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    loads = [int(x) for x in args.loads.split(",")]
    threads = [int(x) for x in args.threads.split(",")]
    if args.child:
        child(args.child, loads, threads, args.reps)
        return
    lines = []
    for model in args.models.split(","):
        for policy in args.policies.split(","):
            env = dict(os.environ)
            env.pop("OMP_WAIT_POLICY", None)
            env.pop("GOMP_SPINCOUNT", None)
            if policy.startswith("spin"):  # libgomp: spin this many times, then sleep
                env["GOMP_SPINCOUNT"] = policy[len("spin") :]
            elif policy != "default":
                env["OMP_WAIT_POLICY"] = policy
            cmd = [sys.executable, __file__, "--child", model, "--loads", args.loads]
            cmd += ["--threads", args.threads, "--reps", str(args.reps)]
            t0 = time.perf_counter()
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if res.returncode:
                sys.stderr.write(res.stderr[-3000:])
                raise SystemExit(f"{model} {policy}: exit {res.returncode}")
            got = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
            for line in got:
                print(json.dumps(line), flush=True)
            lines += got
            print(f"# {model} {policy}: {time.perf_counter() - t0:.0f} s", flush=True)
    if args.json_out:
        with open(args.json_out, "a") as fh:
            fh.writelines(json.dumps(x) + "\n" for x in lines)


if __name__ == "__main__":
    main()
