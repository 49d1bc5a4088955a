"""A step's prompts: which training rows (`PromptSampler`, a resumable order), their token ids
(the task's prompt format, optionally the chat template), and the responses back to text.
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
