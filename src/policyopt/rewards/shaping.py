"""Reward shapers: transforms of the task reward, and terms added to it.

A shaper is registered by name in `SHAPERS` as a factory `(**options) -> RewardShaper`.
The trainer calls each configured shaper in order on every generation round, before the
group filters, with a `ShapingContext`: its view of the round's batch, the step and the policy.

How the parts compose. The step's reward of rollout i is

    R_i = w_task · M'_i + Σ_{f ≠ task} w_f r_f(i) + Σ_terms t_i

- M is the task reward function's value (`reward.task_function`: by default the function
  named "task", else the first), before its weight; `__call__(rewards, ctx)` receives M as
  shaped by the shapers before it and returns it transformed: GAR replaces it (correct ->
  r_base + β max(0, b̂), wrong -> 0), DocPO anneals it (M^γ). M' is the result.
- The other weighted reward functions (a format penalty, a length bonus, a user's
  function) add as configured: no shaper sees or replaces them.
- A shaper that adds a term instead (DAPO's overlong penalty) returns `rewards` unchanged
  and adds its term with `ctx.add_term(name, values)`; terms add after every transform,
  whatever the order of the shapers (so DocPO's power never sees a negative penalty).
Group filters look at M' (`policyopt.train.step`).

A shaper with state (DocPO's dispersion controller) is called once per sampling round, so
possibly several times per training step (dynamic sampling): it must advance its state at
most once per `ctx.step`.

Declared structure (`policyopt.core.structure`): a shaper whose factory is marked
`@needs(name)` reads the value as `ctx.structure[name]` (the config check makes sure a part
that runs earlier declares it, naming the parts that would otherwise, and every producer
is checked at run time to have made what it declares); one
marked `@produces(name)` adds its values with `ctx.add_structure({name: tensor})` ([N] per
rollout or [N, R] per token) or `ctx.add_structure({name: tensor}, pairwise=True)` ([N, N];
e.g. distances computed from parsed rankings and `ctx.group_ids`). They join the step's
`Rollouts.structure`, where later shapers, the advantage estimator and the loss find them; the
trainer checks that a shaper added exactly what it declared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from policyopt.core.registry import Registry

if TYPE_CHECKING:
    from policyopt.rollout.base import Rollouts


class ShapedRound(Protocol):
    """What a shaper reads of a sampling round (the trainer's `Batch` is one)."""

    rollouts: Rollouts
    group_ids: torch.Tensor  # [N]
    correct: torch.Tensor | None  # [N] bool: M >= reward.correct_threshold
    prompts: list[Any]  # text, or a conversational row's messages
    completions: list[str]
    columns: dict[str, list[Any]]  # each dataset column, one entry per rollout

    @property
    def structure(self) -> dict[str, torch.Tensor]: ...

    def with_structure(
        self, values: dict[str, torch.Tensor], pairwise: bool = False
    ) -> ShapedRound: ...


@dataclass
class ShapingContext:
    """A shaper's view of one sampling round: the round's batch, the step, and the policy."""

    batch: ShapedRound
    step: int
    total_steps: int
    # The policy and its tokenizer (GAR runs anchors through it), and the LM-head chunking.
    model: Any = None
    tokenizer: Any = None
    logit_chunk_size: int = 1024
    # rollout.max_new_tokens (DAPO's L_max by default).
    max_new_tokens: int | None = None
    # Additive terms of the reward, by name (`add_term`).
    terms: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def group_ids(self) -> torch.Tensor:
        return self.batch.group_ids

    @property
    def correct(self) -> torch.Tensor:
        if self.batch.correct is None:
            raise ValueError("the round has no verdicts yet (score it before shaping)")
        return self.batch.correct

    @property
    def prompts(self) -> list[Any]:
        return self.batch.prompts

    @property
    def completions(self) -> list[str]:
        return self.batch.completions

    @property
    def columns(self) -> dict[str, list[Any]]:
        return self.batch.columns

    @property
    def rollouts(self) -> Rollouts:
        return self.batch.rollouts

    def add_term(self, name: str, values: torch.Tensor) -> None:
        """Add a term [N] to the reward, after the task reward's transforms."""
        if name in self.terms:
            raise ValueError(f"reward term {name!r} is added twice")
        if values.shape != self.group_ids.shape:
            raise ValueError(
                f"reward term {name!r} has shape {tuple(values.shape)}, expected "
                f"{tuple(self.group_ids.shape)}"
            )
        self.terms[name] = values

    @property
    def structure(self) -> dict[str, torch.Tensor]:
        """The step's declared structure so far; read it, add with `add_structure`."""
        return self.batch.structure

    def add_structure(self, values: dict[str, torch.Tensor], pairwise: bool = False) -> None:
        """Add structure for later parts: [N] or [N, R] values, or [N, N] with `pairwise`."""
        self.batch = self.batch.with_structure(values, pairwise=pairwise)


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
