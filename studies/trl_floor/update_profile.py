"""Profile of the training forward + backward of the log-probs (issue 22):
the embedded model, 128 rows (8 prompts x 16) of 12 prompt + 48 response tokens, one thread.

    python studies/trl_floor/update_profile.py
"""

import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from policyopt.models.logprobs import response_logprobs
from policyopt.models.tiny import tiny_model_path

ROWS, PROMPT, RESPONSE = 128, 12, 48


def main() -> None:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path("tiny"))
    model.train()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (8, PROMPT), generator=g).repeat_interleave(16, 0)
    ids = torch.cat([prompts, torch.randint(3, vocab, (ROWS, RESPONSE), generator=g)], 1)
    mask = torch.ones_like(ids)

    def step() -> None:
        response_logprobs(model, ids, mask, RESPONSE).logp.mean().backward()

    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    times = []
    for _ in range(8):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print("forward + backward, median s:", sorted(times)[len(times) // 2])


if __name__ == "__main__":
    main()
