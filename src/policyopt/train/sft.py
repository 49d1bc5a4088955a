"""Supervised warm start on a task's expert solutions (completion-only loss).

A demonstration is a task's `sft_segments`: (text, trained) segments, one segment for a
plain-string target. Each segment is tokenized alone and the ids concatenated, then EOS;
the loss counts the tokens of trained segments and the EOS, and skips those of the
environment's text (a tool's reply): no loss term, no count in the normaliser, but they stay
in the sequence, read by every later position, as in a multi-turn episode.

Before the first step, every example (prompt, demonstration and EOS) is measured against the
model's positions (`check_sft_positions`): a longer one would train past them, or fail in
the middle of the run when the sampler first draws it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

import torch
from rich.console import Console

from policyopt.config.load import OptimConfig, SFTConfig
from policyopt.models.logprobs import response_logprobs
from policyopt.models.precision import mixed_precision
from policyopt.rollout.hf_engine import left_pad
from policyopt.store.metrics_log import progress_bar
from policyopt.tasks.base import Demonstration, Task
from policyopt.train.optim import build_optimizer
from policyopt.train.prompts import (
    PromptSampler,
    each_row,
    encode_prompts,
    first_row_past_positions,
)


class Example(NamedTuple):
    """One SFT target: the prompt's ids, the completion's ids (EOS last) and, for each
    completion id, 1 if the loss trains on it, 0 if the environment wrote it."""

    prompt: list[int]
    target: list[int]
    trained: list[int]


# An Example, or a (prompt ids, completion ids) pair that trains on every completion id.
ExampleT = TypeVar("ExampleT", bound=Sequence[Any])


def demonstration_ids(tokenizer: Any, segments: Demonstration) -> tuple[list[int], list[int]]:
    """(ids, trained) of a demonstration: each segment tokenized alone, concatenated, EOS.

    Segment by segment, as the multi-turn rollout appends a reply it tokenized alone
    (`rollout/multiturn.py`, `PlainReplies`) to the ids the model sampled before it, and the
    model samples its next turn after the reply's last id: SFT trains on the token sequences
    RL sees. For a character tokenizer these are the whole text's ids; a BPE tokenizer may
    merge characters across a segment boundary in the whole text, a merge an episode never
    holds. A single segment (a plain-string target) is the whole text's ids."""
    ids: list[int] = []
    trained: list[int] = []
    for text, train in segments:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        trained += [int(train)] * len(piece)
    return ids + [tokenizer.eos_token_id], trained + [1]


def sft_examples(
    task: Task, tokenizer: Any, rows: list[dict[str, Any]], chat: bool = False
) -> list[Example]:
    """An `Example` for every SFT demonstration (`Task.sft_segments`) of `rows`."""
    _, prompt_ids = encode_prompts(task, tokenizer, rows, chat)
    examples = []
    for row, p in zip(rows, prompt_ids, strict=True):
        for segments in task.sft_segments(row):
            examples.append(Example(p, *demonstration_ids(tokenizer, segments)))
    return examples


def check_sft_positions(
    model: Any, tokenizer: Any, task: Task, rows: Any, chat: bool = False, data: str = ""
) -> None:
    """Raise a ValueError naming the first of the train `rows` whose prompt plus its longest
    demonstration (EOS included, as `sft_examples` builds it) exceeds the model's positions
    (`max_position_embeddings`; a model without one is not checked). `data` names where the
    rows come from (e.g. "task.options.path=d.jsonl"), for the message."""

    def longest(row: dict[str, Any], bound: bool) -> int:
        # The bound needs no tokenizer pass: a token covers at least one UTF-8 byte, and a
        # segment tokenized alone may gain one word-start marker (SentencePiece); +1 for EOS.
        return max(
            (
                sum(len(text.encode()) + 1 for text, _ in d) + 1
                if bound
                else len(demonstration_ids(tokenizer, d)[0])
                for d in task.sft_segments(row)
            ),
            default=0,
        )

    past = first_row_past_positions(model, tokenizer, task, rows, chat, longest)
    if past is None:
        return
    n, m = past.prompt_tokens, past.after_tokens
    prompt = task.format_prompt(past.row)  # its start, to find the row by
    start = prompt[:40] + ("..." if len(prompt) > 40 else "")
    raise ValueError(
        f"SFT: train row {past.index} (counting from 0) of task {task.name!r}"
        f"{f' ({data})' if data else ''}, prompt {start!r}: its prompt is {n} tokens and "
        f"its longest demonstration {m} (EOS included), {n + m} positions, more than the "
        f"{past.limit} of {past.model} (max_position_embeddings); shorten or drop the row, "
        "or use a model with more positions"
    )


def sft_data_digest(task: Task) -> str:
    """sha256 of what SFT reads of the task's train split, row by row in order: each prompt
    (its text, or its chat messages) and its demonstrations (`Task.sft_segments`)."""
    digest = hashlib.sha256()
    for row in each_row(task.rows("train")):
        messages = task.prompt_messages(row)
        prompt = task.format_prompt(row) if messages is None else messages
        line = json.dumps([prompt, task.sft_segments(row)], sort_keys=True, default=str)
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


def _trained(example: Sequence[Any]) -> list[int]:
    """An example's trained flags; every completion id of a (prompt, completion) pair."""
    return list(example[2]) if len(example) > 2 else [1] * len(example[1])


def completion_batch(
    examples: Sequence[Sequence[Any]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """[left-padded prompts | right-padded completions]: (ids, attention mask, R, loss mask).
    `examples` are `Example`s or (prompt ids, completion ids) pairs; the attention mask reads
    every completion id, the loss mask only the trained ones."""
    prompt_ids, prompt_mask = left_pad([ex[0] for ex in examples], pad_id)
    width = max(len(ex[1]) for ex in examples)
    comp = torch.full((len(examples), width), pad_id, dtype=torch.long)
    cmask = torch.zeros((len(examples), width), dtype=torch.long)
    lmask = torch.zeros((len(examples), width))
    for i, ex in enumerate(examples):
        c = ex[1]
        comp[i, : len(c)] = torch.tensor(c)
        cmask[i, : len(c)] = 1
        lmask[i, : len(c)] = torch.tensor(_trained(ex), dtype=torch.float)
    return (
        torch.cat([prompt_ids, comp], 1),
        torch.cat([prompt_mask, cmask], 1),
        width,
        lmask,
    )


def length_buckets(examples: list[ExampleT], buckets: int) -> list[list[ExampleT]]:
    """`examples` sorted by total length and cut into `buckets` nearly equal parts (fewer if
    there are fewer examples). A batch that mixes answer-only and worked targets is half
    padding when padded as one (the embedded arithmetic task: 50% of 64 x 55 positions);
    buckets of similar lengths pad far less."""
    ordered = sorted(examples, key=lambda ex: len(ex[0]) + len(ex[1]))
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
    examples: list[ExampleT],
    pad_id: int,
    *,
    buckets: int = 1,
    chunk_size: int = 1024,
) -> float:
    """Backward of the batch's completion loss, -sum(log p) / trained tokens over the whole
    batch (the environment's tokens in neither sum), run as `buckets` length-sorted
    micro-batches (each one's sum divided by the batch's count, so the gradients add up to
    the one-batch gradient); the loss. `examples`: `Example`s, or (prompt ids, completion
    ids) pairs trained whole. The forward runs in the model's precision (`models.precision`:
    bfloat16 autocast under bf16-mixed)."""
    count = sum(sum(_trained(ex)) for ex in examples)
    total = 0.0
    for chunk in length_buckets(examples, buckets):
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
    data: str = "",
) -> dict[str, float]:
    """Train on expert solutions for `cfg.steps` steps or `cfg.max_seconds`, whichever first.
    Every example is checked against the model's positions first (`check_sft_positions`;
    `data` names the rows' file in its message)."""
    rows = task.rows("train")
    if not task.sft_segments(rows[0]):
        column = getattr(task, "solution_column", "missing")
        hint = (
            "; name the column of worked solutions with task.options.solution_column"
            if column is None
            else ""
        )
        raise ValueError(f"task {task.name!r} has no expert solutions to fine-tune on{hint}")
    check_sft_positions(model, tokenizer, task, rows, chat, data)
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
