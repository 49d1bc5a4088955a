"""Supervised warm start on a task's expert solutions (completion-only loss)."""

from __future__ import annotations

import time
from typing import Any

import torch
from rich.console import Console

from policyopt.config.load import OptimConfig, SFTConfig
from policyopt.models.logprobs import response_logprobs
from policyopt.models.precision import mixed_precision
from policyopt.rollout.hf_engine import left_pad
from policyopt.store.metrics_log import progress_bar
from policyopt.tasks.base import Task
from policyopt.train.optim import build_optimizer
from policyopt.train.prompts import PromptSampler, encode_prompts


def sft_examples(
    task: Task, tokenizer: Any, rows: list[dict[str, Any]], chat: bool = False
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids + EOS) for every SFT target of `rows`."""
    _, prompt_ids = encode_prompts(task, tokenizer, rows, chat)
    pairs = []
    for row, p in zip(rows, prompt_ids, strict=True):
        for solution in task.sft_targets(row):
            target = tokenizer(solution, add_special_tokens=False)["input_ids"] + [
                tokenizer.eos_token_id
            ]
            pairs.append((p, target))
    return pairs


def completion_batch(
    pairs: list[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """[left-padded prompts | right-padded completions]: (ids, attention mask, R, loss mask)."""
    prompt_ids, prompt_mask = left_pad([p for p, _ in pairs], pad_id)
    width = max(len(c) for _, c in pairs)
    comp = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    cmask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (_, c) in enumerate(pairs):
        comp[i, : len(c)] = torch.tensor(c)
        cmask[i, : len(c)] = 1
    return (
        torch.cat([prompt_ids, comp], 1),
        torch.cat([prompt_mask, cmask], 1),
        width,
        cmask.float(),
    )


def length_buckets(
    pairs: list[tuple[list[int], list[int]]], buckets: int
) -> list[list[tuple[list[int], list[int]]]]:
    """`pairs` sorted by total length and cut into `buckets` nearly equal parts (fewer if
    there are fewer pairs). A batch that mixes answer-only and worked targets is half padding
    when padded as one (the embedded arithmetic task: 50% of 64 x 55 positions); buckets of
    similar lengths pad far less."""
    ordered = sorted(pairs, key=lambda pc: len(pc[0]) + len(pc[1]))
    parts = max(1, min(buckets, len(ordered)))
    size, extra = divmod(len(ordered), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        out.append(ordered[start:end])
        start = end
    return out


def sft_backward(
    model: torch.nn.Module,
    pairs: list[tuple[list[int], list[int]]],
    pad_id: int,
    *,
    buckets: int = 1,
    chunk_size: int = 1024,
) -> float:
    """Backward of the batch's completion loss, -sum(log p) / completion tokens over the
    whole batch, run as `buckets` length-sorted micro-batches (each one's sum divided by the
    batch's count, so the gradients add up to the one-batch gradient); the loss. The forward
    runs in the model's precision (`models.precision`: bfloat16 autocast under bf16-mixed)."""
    count = sum(len(c) for _, c in pairs)
    total = 0.0
    for chunk in length_buckets(pairs, buckets):
        ids, mask, width, loss_mask = completion_batch(chunk, pad_id)
        with mixed_precision(model):
            logp = response_logprobs(model, ids, mask, width, chunk_size=chunk_size).logp
        loss = -(logp * loss_mask).sum() / count
        loss.backward()
        total += float(loss.detach())
    return total


def run_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    cfg: SFTConfig,
    *,
    seed: int = 0,
    chunk_size: int = 1024,
    chat: bool = False,
    console: Console | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Train on expert solutions for `cfg.steps` steps or `cfg.max_seconds`, whichever first."""
    rows = task.rows("train")
    if not task.sft_targets(rows[0]):
        column = getattr(task, "solution_column", "missing")
        hint = (
            "; name the column of worked solutions with task.options.solution_column"
            if column is None
            else ""
        )
        raise ValueError(f"task {task.name!r} has no expert solutions to fine-tune on{hint}")
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    optim_cfg = OptimConfig(
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        schedule="cosine",
        max_grad_norm=1.0,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(params, optim_cfg, cfg.steps)
    sampler = PromptSampler(len(rows), seed + 7919)
    model.train()
    start = time.perf_counter()
    loss_value, step = float("nan"), 0
    with progress_bar(console, progress) as bar:
        bar_id = bar.add_task("sft", total=cfg.steps, status="")
        for step in range(1, cfg.steps + 1):
            picked = [rows[i] for i in sampler.take(cfg.batch_size)]
            loss_value = sft_backward(
                model,
                sft_examples(task, tokenizer, picked, chat),
                pad_id,
                buckets=cfg.length_buckets,
                chunk_size=chunk_size,
            )
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            bar.update(bar_id, completed=step, status=f"loss {loss_value:.4f}")
            if cfg.max_seconds and time.perf_counter() - start > cfg.max_seconds:
                break
    model.eval()
    return {
        "sft/loss": loss_value,
        "sft/steps": float(step),
        "sft/seconds": time.perf_counter() - start,
    }
