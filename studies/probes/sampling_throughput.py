"""Sampling throughput of the HF and vLLM engines side by side on one model (CPU or GPU).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1 \
        python studies/probes/sampling_throughput.py --model smollm2 --completions 64 --max-new-tokens 32

Both engines sample from the same weights (vLLM's copy is exported from the loaded model),
the same chat prompts (G completions each), alternating engine order per round after one
warm-up call each. Reported per engine: median wall time, median CPU time of this process
(vLLM runs in-process, so its work is counted; on a loaded shared machine CPU time is the
steadier measure), generated tokens, and tokens per wall second and per CPU second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2")
    p.add_argument("--completions", type=int, default=64)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vllm-dtype", default=None)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()

    import torch

    from policyopt.models.loading import load_model
    from policyopt.rollout.base import ENGINES, SamplingParams
    from policyopt.tasks.base import get_task
    from policyopt.train.prompts import encode_prompts

    torch.manual_seed(0)
    model, tok = load_model(args.model)
    task = get_task("arithmetic")
    rows = [task.rows("train")[i] for i in range(args.completions // args.group_size)]
    _, ids = encode_prompts(task, tok, rows, chat=tok.chat_template is not None)
    prompts = [p for p in ids for _ in range(args.group_size)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    options = {"dtype": args.vllm_dtype} if args.vllm_dtype else {}
    engines = {
        "hf": ENGINES.get("hf")(model, tok),
        "vllm": ENGINES.get("vllm")(model, tok, **options),
    }
    for engine in engines.values():
        engine.generate(prompts[: args.group_size], params)  # warm-up
    runs: dict[str, list[tuple[float, float, int]]] = {k: [] for k in engines}
    for round_ in range(args.rounds):
        for name in list(engines) if round_ % 2 == 0 else list(engines)[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            r = engines[name].generate(prompts, params)
            runs[name].append(
                (time.perf_counter() - wall, time.process_time() - cpu, r.generated_tokens)
            )
    report = {
        name: {
            "wall_s": statistics.median(w for w, _, _ in rs),
            "cpu_s": statistics.median(c for _, c, _ in rs),
            "generated_tokens": statistics.median(n for _, _, n in rs),
            "tokens_per_wall_s": sum(n for _, _, n in rs) / sum(w for w, _, _ in rs),
            "tokens_per_cpu_s": sum(n for _, _, n in rs) / sum(c for _, c, _ in rs),
        }
        for name, rs in runs.items()
    }
    report["settings"] = vars(args) | {"torch_threads": torch.get_num_threads()}
    text = json.dumps(report, indent=2)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
