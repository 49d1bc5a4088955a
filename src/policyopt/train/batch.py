"""The one batch of a training step: rollouts plus what each stage adds to them.

The stages of `policyopt.train.step` fill it in order: the rollout stage gives the
rollouts, group ids, prompts, completions and columns; the score stage the reward
functions' values; the shape stage the shaped task reward and the step's total; the
advantage stage the advantages and the loss mask. Rewards are one dict of named [N]
tensors (`REWARD_KEYS`), declared structure one dict (`Batch.structure`, the rollouts').
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from policyopt.rollout.base import Rollouts, concat_rollouts, response_span

# The named entries of `Batch.rewards` (each [N]); also `function/<name>` per reward function
# (its value, None as 0, float64 as the function returned it) and `term/<name>` per additive
# shaper term (DAPO's overlong penalty).
REWARD_KEYS = {
    "weighted": "Σ_f w_f r_f: the reward functions' weighted total, before shaping",
    "M": "the task reward: the task function's value (reward.task_function), unweighted",
    "other": "Σ_{f ≠ task} w_f r_f: the other functions' weighted values",
    "M_shaped": "M': M after the shapers that transform it; what group filters see",
    "total": "R = w_task M' + other + Σ terms: the step's reward, what advantages see",
}


@dataclass
class Batch:
    """One step's rollouts and everything the stages attach to them, one row per rollout."""

    rollouts: Rollouts
    group_ids: torch.Tensor  # [N] long: rollouts of one prompt share an id
    prompts: list[Any]  # text, or a conversational row's messages
    completions: list[str]
    columns: dict[str, list[Any]]  # each dataset column, one entry per rollout
    rewards: dict[str, torch.Tensor] = field(default_factory=dict)  # REWARD_KEYS
    correct: torch.Tensor | None = None  # [N] bool: M >= reward.correct_threshold
    advantages: torch.Tensor | None = None  # [N] or [N, R]
    # Per-token loss mask: the response mask, minus filtered (e.g. truncated) responses.
    loss_mask: torch.Tensor | None = None
    unparseable: int = 0  # completions some reward function could not score
    metrics: dict[str, float] = field(default_factory=dict)  # from the shapers

    def __len__(self) -> int:
        return len(self.rollouts)

    @property
    def structure(self) -> dict[str, torch.Tensor]:
        """Declared structure so far (`policyopt.core.structure`): [N], [N, R] or [N, N]."""
        return self.rollouts.structure

    def with_structure(self, values: dict[str, torch.Tensor], pairwise: bool = False) -> Batch:
        """This batch with structure added (`Rollouts.with_structure`); earlier copies keep
        theirs."""
        return replace(self, rollouts=self.rollouts.with_structure(values, pairwise=pairwise))

    def function_values(self) -> dict[str, torch.Tensor]:
        """Each reward function's values, by function name."""
        return {
            k[len("function/") :]: v for k, v in self.rewards.items() if k.startswith("function/")
        }

    def select(self, keep: torch.Tensor) -> Batch:
        """Rows where `keep` (bool [N]) holds."""
        idx = keep.nonzero().squeeze(-1)
        pick = idx.tolist()
        return replace(
            self,
            rollouts=self.rollouts.select(idx),
            group_ids=self.group_ids[idx],
            prompts=[self.prompts[i] for i in pick],
            completions=[self.completions[i] for i in pick],
            columns={k: [v[i] for i in pick] for k, v in self.columns.items()},
            rewards={k: v[idx] for k, v in self.rewards.items()},
            correct=None if self.correct is None else self.correct[idx],
            advantages=None if self.advantages is None else self.advantages[idx],
            loss_mask=None if self.loss_mask is None else self.loss_mask[idx],
        )

    @staticmethod
    def concat(parts: list[Batch], pad_id: int) -> Batch:
        """The parts' rows stacked (rollouts re-padded); shaping metrics averaged over the
        parts that have them."""
        if len(parts) == 1:
            return parts[0]
        if any(p.advantages is not None or p.loss_mask is not None for p in parts):
            raise ValueError("concatenate batches before their advantages are computed")
        first = parts[0]
        keys = {k for p in parts for k in p.metrics}
        return Batch(
            rollouts=concat_rollouts([p.rollouts for p in parts], pad_id),
            group_ids=torch.cat([p.group_ids for p in parts]),
            prompts=[x for p in parts for x in p.prompts],
            completions=[x for p in parts for x in p.completions],
            columns={k: [x for p in parts for x in p.columns[k]] for k in first.columns},
            rewards={k: torch.cat([p.rewards[k] for p in parts]) for k in first.rewards},
            correct=None if first.correct is None else torch.cat([p.correct for p in parts]),
            unparseable=sum(p.unparseable for p in parts),
            metrics={
                k: sum(p.metrics[k] for p in parts if k in p.metrics)
                / sum(k in p.metrics for p in parts)
                for k in keys
            },
        )


def trim(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Drop all-padding columns (left of prompts, right of responses) of a micro-batch.

    Returns (input_ids, attention_mask, response_width). The attention mask covers each
    response through its last generated token (`response_span`): a multi-turn rollout's
    environment tokens, response mask 0, are read though they are not trained on.
    """
    keep_p = prompt_mask.any(0).nonzero()
    start = int(keep_p[0]) if len(keep_p) else prompt_mask.shape[1]
    used = response_mask.any(0).nonzero()
    width = int(used[-1]) + 1 if len(used) else 1
    ids = torch.cat([prompt_ids[:, start:], response_ids[:, :width]], 1)
    mask = torch.cat([prompt_mask[:, start:], response_span(response_mask[:, :width])], 1)
    return ids, mask, width


def consumer_structure(rollouts: Rollouts) -> dict[str, torch.Tensor]:
    """What consumers may ask for: the built-in values (`core.structure.BUILTIN`) and the
    rollouts' declared structure."""
    return {
        "response_mask": rollouts.response_mask,
        "entropies": rollouts.entropies,
        **rollouts.structure,
    }


def slice_structure(
    values: dict[str, torch.Tensor], pairwise: frozenset[str], rows: torch.Tensor, width: int
) -> dict[str, torch.Tensor]:
    """Micro-batch `rows` of each value: [N] -> [n], [N, R] -> [n, width], [N, N] -> [n, n]."""
    out = {}
    for name, value in values.items():
        picked = value[rows]
        if name in pairwise:
            out[name] = picked[:, rows]
        elif picked.dim() == 2:
            out[name] = picked[:, :width]
        else:
            out[name] = picked
    return out
