"""Deterministic, resumable order over a task's training rows."""

from __future__ import annotations

from typing import Any

import torch


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
