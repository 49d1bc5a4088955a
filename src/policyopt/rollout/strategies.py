"""Rollout strategies and annotators: the first plug point of the loop.

A strategy turns tokenised prompts into responses: `parallel` samples G independent
responses per prompt; DATPO's tree strategy forks branches from shared prefixes. A strategy
may score partial results through the `score` callback (the tree needs V(root) before it
decides how many branches to grow) and returns the rollouts with, for each row, the index
of its prompt. It may pass responses on as they end through `on_finished(prompt_index,
token_ids)` (so slow rewards can start early: `RolloutEngine.generate`); that is a hint the
caller must not depend on. It is handed the data rows the prompts were built from (`rows`,
one per prompt, the task's columns): `multi_turn` starts each episode's environment from its
row; a strategy that does not need them ignores them.

An annotator adds per-token structure computed at rollout time from what the behaviour
policy recorded (HISPO's entropy segments) to `Rollouts.structure`; it stays fixed during the
update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from policyopt.core.registry import Registry
from policyopt.rollout.base import FinishedFn, RolloutEngine, Rollouts, SamplingParams

# score(rollouts, prompt_index) -> rewards [N]
ScoreFn = Callable[[Rollouts, torch.Tensor], torch.Tensor]
# strategy(engine, prompts, params, *, group_size, score, on_finished, rows, **options)
#   -> (rollouts, prompt_index)
RolloutStrategy = Callable[..., tuple[Rollouts, torch.Tensor]]
ROLLOUT_STRATEGIES: Registry[RolloutStrategy] = Registry("rollout strategy")

# annotator(rollouts, **options) -> {key: Tensor [N, R]}
Annotator = Callable[..., dict[str, torch.Tensor]]
ROLLOUT_ANNOTATORS: Registry[Annotator] = Registry("rollout annotator")


@ROLLOUT_STRATEGIES.register("parallel")
def parallel(
    engine: RolloutEngine,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    group_size: int,
    score: ScoreFn | None = None,
    on_finished: FinishedFn | None = None,
    rows: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[Rollouts, torch.Tensor]:
    """G independent samples per prompt (GRPO and most methods); no options."""
    del rows  # the samples do not depend on the rows' columns
    rollouts = engine.generate(
        [p for p in prompts for _ in range(group_size)],
        params,
        None if on_finished is None else lambda row, ids: on_finished(row // group_size, ids),
    )
    return rollouts, torch.arange(len(prompts)).repeat_interleave(group_size)
