"""The batch of one training step: rollouts plus what the reward and advantage stages add."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from policyopt.rollout.base import Rollouts


@dataclass
class StepBatch:
    """What the update needs: the rollouts, their (shaped) rewards and advantages."""

    rollouts: Rollouts
    group_ids: torch.Tensor  # [N] long
    prompts: list[str]
    completions: list[str]
    rewards: torch.Tensor  # [N] after shaping
    advantages: torch.Tensor  # [N] or [N, R]
    # Per-token loss mask: the response mask, minus filtered (e.g. truncated) responses.
    loss_mask: torch.Tensor

    def __len__(self) -> int:
        return len(self.rollouts)


def micro_slices(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def trim(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Drop all-padding columns (left of prompts, right of responses) of a micro-batch.

    Returns (input_ids, attention_mask, response_width).
    """
    keep_p = prompt_mask.any(0).nonzero()
    start = int(keep_p[0]) if len(keep_p) else prompt_mask.shape[1]
    used = response_mask.any(0).nonzero()
    width = int(used[-1]) + 1 if len(used) else 1
    ids = torch.cat([prompt_ids[:, start:], response_ids[:, :width]], 1)
    mask = torch.cat([prompt_mask[:, start:], response_mask[:, :width].long()], 1)
    return ids, mask, width
