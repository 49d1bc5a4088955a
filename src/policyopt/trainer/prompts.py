"""Prompts to token ids (a task's format, optionally the chat template) and responses to text."""

from __future__ import annotations

from typing import Any

from policyopt.rollout.base import Rollouts
from policyopt.tasks.base import Task


def encode_prompts(
    task: Task, tokenizer: Any, rows: list[dict[str, Any]], chat: bool
) -> tuple[list[str], list[list[int]]]:
    texts = [task.format_prompt(row) for row in rows]
    if chat:
        ids = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True
            )
            for t in texts
        ]
        # Recent transformers return a BatchEncoding (a mapping), older ones a list of ids.
        ids = [list(x["input_ids"]) if hasattr(x, "keys") else list(x) for x in ids]
    else:
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return texts, ids


def decode(tokenizer: Any, rollouts: Rollouts) -> list[str]:
    lengths = rollouts.lengths.tolist()
    return tokenizer.batch_decode(
        [row[:n] for row, n in zip(rollouts.response_ids.tolist(), lengths, strict=True)],
        skip_special_tokens=True,
    )
