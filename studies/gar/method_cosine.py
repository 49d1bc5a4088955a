"""Do correct rollouts that follow the expert's method align better with it? (GAR, SPEC §3)

    python -m studies.gar.method_cosine --model DIR [--prompts 64] [--samples 16]

The GAR paper reports, qualitatively, that among correct rollouts those that solve a problem
the way the expert solution does get a higher gradient cosine with it. The embedded
arithmetic task admits two ways to a correct answer: the worked steps of the expert
solution (`7+12=19. 19-5=14. A:14`) and the bare answer (`A:14`), which a warm start
trained with `terse_fraction > 0` produces too. This samples `--samples` rollouts for each
of the first `--prompts` training problems from the policy in DIR, computes the GAR cosine
b_i = v_i^T v_a of every correct rollout against the problem's expert solution (the same
`batched_gradient_signal` and teacher-forced anchor the `gar` shaper uses, whole response
as the span), and compares the two kinds: overall, and paired within the problems that have
correct rollouts of both kinds. Prints (and with --json-out writes) the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from policyopt.methods.gar.shaper import teacher_forced_hidden
from policyopt.methods.gar.signal import batched_gradient_signal, output_layer
from policyopt.models.loading import load_model
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.hf_engine import HFEngine
from policyopt.tasks.arithmetic import ArithmeticTask, solution_style
from policyopt.train.prompts import decode, encode_prompts
from policyopt.train.sft import completion_batch


def method_cosines(
    model: Any, tokenizer: Any, prompts: int, samples: int, seed: int = 0
) -> dict[str, Any]:
    """GAR cosines of the correct rollouts, by solution style (see the module doc)."""
    task = ArithmeticTask(seed=seed)
    rows = [task.rows("train")[i] for i in range(prompts)]
    _, prompt_ids = encode_prompts(task, tokenizer, rows, False)
    engine = HFEngine(model, tokenizer, generator=torch.Generator().manual_seed(seed))
    r = engine.generate(
        [p for p in prompt_ids for _ in range(samples)],
        SamplingParams(max_new_tokens=48, temperature=1.0, with_hidden=True),
    )
    texts = decode(tokenizer, r)
    problem = [i // samples for i in range(len(texts))]
    correct = [(task.verify(t, rows[p]) or 0.0) >= 1.0 for t, p in zip(texts, problem, strict=True)]
    keep = torch.tensor([i for i, c in enumerate(correct) if c], dtype=torch.long)
    if not len(keep):
        raise ValueError("no correct rollout: nothing to compare (use a trained policy)")
    weight, bias = output_layer(model)
    width = int(r.lengths[keep].max())
    with torch.no_grad():
        v = batched_gradient_signal(
            r.hidden[keep, :width],
            r.response_mask[keep, :width],
            weight,
            bias,
            r.response_ids[keep, :width],
        )
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        anchors = [
            tokenizer(task.expert_solutions(row)[0], add_special_tokens=False)["input_ids"]
            + [tokenizer.eos_token_id]
            for row in rows
        ]
        ids, mask, a_width, a_mask = completion_batch(
            list(zip(prompt_ids, anchors, strict=True)), pad
        )
        v_a = batched_gradient_signal(
            teacher_forced_hidden(model, ids, mask, a_width),
            a_mask,
            weight,
            bias,
            ids[:, -a_width:],
        )
    by_problem: dict[int, dict[str, list[float]]] = {}
    for row_v, i in zip(v, keep.tolist(), strict=True):
        style = solution_style(texts[i])
        cosine = float(row_v @ v_a[problem[i]])
        by_problem.setdefault(problem[i], {"worked": [], "terse": []})[style].append(cosine)
    return summarise(by_problem, n_rollouts=len(texts))


def summarise(by_problem: dict[int, dict[str, list[float]]], n_rollouts: int) -> dict[str, Any]:
    """Means by style, and the paired within-problem difference worked - terse."""
    out: dict[str, Any] = {"rollouts": n_rollouts}
    for style in ("worked", "terse"):
        values = [c for groups in by_problem.values() for c in groups[style]]
        out[f"{style}_correct"] = len(values)
        out[f"{style}_cosine_mean"] = statistics.fmean(values) if values else float("nan")
    diffs = [
        statistics.fmean(g["worked"]) - statistics.fmean(g["terse"])
        for g in by_problem.values()
        if g["worked"] and g["terse"]
    ]
    out["paired_problems"] = len(diffs)
    out["paired_diff_mean"] = statistics.fmean(diffs) if diffs else float("nan")
    out["paired_worked_higher_fraction"] = (
        sum(d > 0 for d in diffs) / len(diffs) if diffs else float("nan")
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a policy directory (SFT or RL checkpoint)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.model)
    model.eval()
    result = method_cosines(model, tokenizer, args.prompts, args.samples, args.seed)
    print(json.dumps(result, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
