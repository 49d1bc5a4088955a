"""Reward shapers: transforms of the verifier's rewards that need more than the rewards.

A shaper is registered by name in `SHAPERS` as a factory `(**options) -> RewardShaper`.
The trainer calls each configured shaper in order, after the verifier and DAPO's overlong
term, with a `ShapingContext` describing the batch. GAR (gradient-aligned bonus) and DocPO
(step-aware annealing) are shapers.

Declared structure (`policyopt.core.structure`): a shaper whose factory is marked
`@needs(name)` reads the value as `ctx.structure[name]` (the trainer checks it is there
before calling the shaper, and names the part that should have produced it otherwise); one
marked `@produces(name)` adds its values with `ctx.add_structure({name: tensor})` ([N] per
rollout or [N, R] per token) or `ctx.add_structure({name: tensor}, pairwise=True)` ([N, N];
e.g. distances computed from parsed rankings and `ctx.group_ids`). They join the step's
`Rollouts.extras`, where later shapers, the advantage estimator and the loss find them; the
trainer checks that a shaper added exactly what it declared.
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

    @property
    def structure(self) -> dict[str, torch.Tensor]:
        """The step's declared structure so far (`Rollouts.extras`); read it, add with
        `add_structure`."""
        return self.rollouts.extras

    def add_structure(self, values: dict[str, torch.Tensor], pairwise: bool = False) -> None:
        """Add structure for later parts: [N] or [N, R] values, or [N, N] with `pairwise`."""
        self.rollouts.add_extras(values, pairwise=pairwise)


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
