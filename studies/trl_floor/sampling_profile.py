"""Profile of sampling (issue 22): `HFEngine.generate` on the embedded model,
128 rows (8 prompts x 16) of 12 prompt tokens, 48 new tokens, one thread.

    python studies/trl_floor/sampling_profile.py
"""

import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, AutoTokenizer

from policyopt.models.tiny import tiny_model_path
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.hf_engine import HFEngine


def main() -> None:
    torch.set_num_threads(1)
    path = tiny_model_path("tiny")
    model = AutoModelForCausalLM.from_pretrained(path)
    engine = HFEngine(
        model, AutoTokenizer.from_pretrained(path), generator=torch.Generator().manual_seed(0)
    )
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 100, (12,), generator=g).tolist() for _ in range(8)]
    prompts = [p for p in prompts for _ in range(16)]
    params = SamplingParams(max_new_tokens=48, temperature=1.0)
    for _ in range(2):
        engine.generate(prompts, params)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            engine.generate(prompts, params)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        engine.generate(prompts, params)
        times.append(time.perf_counter() - t0)
    print("generate, median s:", sorted(times)[len(times) // 2])


if __name__ == "__main__":
    main()
