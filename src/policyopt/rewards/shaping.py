"""Reward shapers: transforms of the verifier's rewards that need more than the rewards.

A shaper is registered by name in `SHAPERS` as a factory `(**options) -> RewardShaper`.
The trainer calls each configured shaper in order, after the verifier and DAPO's overlong
term, with a `ShapingContext` describing the batch. GAR (gradient-aligned bonus) and DocPO
(step-aware annealing) are shapers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from policyopt.core.registry import Registry

if TYPE_CHECKING:
    from policyopt.rollout.base import Rollouts


@dataclass
class ShapingContext:
    """What a shaper may look at. `columns` holds each dataset column, one entry per sample."""

    step: int
    total_steps: int
    group_ids: torch.Tensor  # [N]
    correct: torch.Tensor  # [N] bool: passed the verifier
    prompts: list[str]
    completions: list[str]
    columns: dict[str, list[Any]]
    rollouts: Rollouts
    # The policy and its tokenizer (GAR runs anchors through it), and the LM-head chunking.
    model: Any = None
    tokenizer: Any = None
    logit_chunk_size: int = 1024
    raw: dict[str, list[float]] = field(default_factory=dict)
    # The weighted verifier total before any shaping [N]; `rewards - verifier_rewards` is what
    # earlier shaping added (DAPO's overlong term), which a shaper that replaces the
    # verifier's reward (GAR) keeps.
    verifier_rewards: torch.Tensor | None = None


class RewardShaper:
    """Base class: `__call__` returns shaped rewards [N] and metrics to log."""

    def __call__(
        self, rewards: torch.Tensor, ctx: ShapingContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    # Shapers with state (DocPO's dispersion controller) override these for resume.
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


SHAPERS: Registry[Callable[..., RewardShaper]] = Registry("reward shaper")
