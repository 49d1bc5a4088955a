"""A step's prompts: which training rows (`PromptSampler`, a resumable order), their token ids
(the task's prompt format, optionally the chat template), and the responses back to text.

A row whose prompt is a list of chat messages (TRL's conversational format; a task says so
with `prompt_messages(row)`) goes through the tokenizer's chat template as those messages,
whatever `chat` says, as TRL does: there is no other way to hand a model messages, and
turning them into the text "[{'role': 'user', ...}]" would train on that text.
"""

from __future__ import annotations

from typing import Any

import torch

from policyopt.rollout.base import Rollouts
from policyopt.tasks.base import Task


class PromptSampler:
    """Yields row indices in a fresh seeded permutation each epoch.

    Its whole state is (epoch, position), so a resumed run draws the same prompts as an
    uninterrupted one.
    """

    def __init__(self, n_rows: int, seed: int) -> None:
        if n_rows <= 0:
            raise ValueError("the training split has no rows")
        self.n_rows = n_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n_rows, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.position == self.n_rows:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation()
            step = min(k - len(out), self.n_rows - self.position)
            out.extend(self._order[self.position : self.position + step])
            self.position += step
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._permutation()


def encode_prompts(
    task: Task, tokenizer: Any, rows: list[dict[str, Any]], chat: bool
) -> tuple[list[Any], list[list[int]]]:
    """(prompts, token ids) of `rows`. A prompt is the task's text, or for a conversational
    row its list of messages: what reward functions get as `prompts` and what
    samples.jsonl records (TRL hands reward functions the messages too)."""
    prompts: list[Any] = []
    ids: list[list[int]] = []
    for row in rows:
        messages = task.prompt_messages(row)
        if messages is not None:
            _check_chat_template(tokenizer)
            prompts.append(messages)
            ids.append(_chat_ids(tokenizer, messages, task.tools))
            continue
        text = task.format_prompt(row)
        prompts.append(text)
        if chat:
            ids.append(_chat_ids(tokenizer, [{"role": "user", "content": text}], task.tools))
        else:
            ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts, ids


def _chat_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: tuple[dict[str, Any], ...] = ()
) -> list[int]:
    """The prompt through the chat template, with the task's tools (their JSON schemas) for
    templates that list them (`apply_chat_template(..., tools=...)`)."""
    x = tokenizer.apply_chat_template(
        messages, tools=list(tools) or None, add_generation_prompt=True, tokenize=True
    )
    # Recent transformers return a BatchEncoding (a mapping), older ones a list of ids.
    return list(x["input_ids"]) if hasattr(x, "keys") else list(x)


def check_chat_template(config: Any, tokenizer: Any) -> None:
    """`model.chat_template: true` with a tokenizer that has none (the embedded model's
    character tokenizer) is one line before any work, not transformers' error mid-run."""
    from policyopt.config.schema import ConfigError

    if config.model.chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"model.chat_template: true, but the tokenizer of {config.model.name_or_path!r} "
            "has no chat template; set model.chat_template: false (plain-text prompts)"
        )


def _check_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            "the task's prompts are lists of chat messages (TRL's conversational format), "
            f"which go through the tokenizer's chat template, and the tokenizer of {name!r} "
            "has none: use a chat model's tokenizer, or give the prompts as text"
        )


def decode(tokenizer: Any, rollouts: Rollouts) -> list[str]:
    lengths = rollouts.lengths.tolist()
    return tokenizer.batch_decode(
        [row[:n] for row, n in zip(rollouts.response_ids.tolist(), lengths, strict=True)],
        skip_special_tokens=True,
    )
