"""Prompts -> G rollouts each -> rewards -> shaping -> group filter (DAPO dynamic sampling).

DESIGN's order: the reward pipeline (verifier, then shapers) runs on each generation round
before the group filters, so that a filter sees the shaped rewards. What a filter looks at is
the task reward after the shapers that transform it (`Scored.filter_rewards`: GAR's bonus,
DocPO's annealed M), not the additive terms (the other weighted reward functions, DAPO's
overlong penalty): DAPO drops the groups whose accuracy is 0 or 1 (arXiv 2503.14476, §3.2),
also when the length penalty makes their rewards differ, while a group whose rollouts are
all correct still carries GAR's bonus and is kept.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import datasets
import torch

from policyopt.core.filters import GROUP_FILTERS
from policyopt.core.structure import check_declared_made, check_produced
from policyopt.rewards.functions import RewardPipeline
from policyopt.rewards.shaping import SHAPERS
from policyopt.rollout.base import RolloutEngine, Rollouts, SamplingParams, concat_rollouts
from policyopt.rollout.strategies import ROLLOUT_ANNOTATORS, ROLLOUT_STRATEGIES
from policyopt.tasks.base import Task
from policyopt.trainer.config import Config


@dataclass
class Scored:
    """One generation round's rollouts and rewards, split into the task term and the rest.

    The reward of rollout i is w_task · M_i + Σ_{f ≠ task} w_f r_f(i) (+ shaper terms): M is
    the task reward function's value (`reward.task_function`), which the shapers transform.
    """

    rollouts: Rollouts
    group_ids: torch.Tensor
    prompts: list[str]
    completions: list[str]
    columns: dict[str, list[Any]]
    task_rewards: torch.Tensor  # M [N]: the task function's value (None -> 0), unweighted
    task_weight: float  # w_task
    other_rewards: torch.Tensor  # Σ_{f ≠ task} w_f r_f [N]
    raw_rewards: torch.Tensor  # the pipeline's weighted total, unshaped [N] (reward/mean)
    correct: torch.Tensor  # M >= reward.correct_threshold
    # After shaping (`Trainer._shape_round`); until then the unshaped values.
    rewards: torch.Tensor  # the step's reward [N]
    filter_rewards: torch.Tensor  # the shaped task term: what group filters look at [N]
    per_function: dict[str, list[float]] = field(default_factory=dict)
    unparseable: int = 0
    shaping_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutTimes:
    generation: float = 0.0
    scoring: float = 0.0
    rounds: int = 0
    generated_tokens: int = 0
    sampled_groups: int = 0


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


def generate_and_score(
    *,
    rows: datasets.Dataset,
    indices: list[int],
    group_offset: int,
    task: Task,
    tokenizer: Any,
    engine: RolloutEngine,
    reward_fn: RewardPipeline,
    config: Config,
    times: RolloutTimes,
) -> Scored:
    picked = [rows[i] for i in indices]
    texts, ids = encode_prompts(task, tokenizer, picked, config.model.chat_template)
    params = SamplingParams(
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        with_hidden=needs_hidden(config),
    )

    def score(rollouts: Rollouts, prompt_index: torch.Tensor) -> torch.Tensor:
        """Verifier rewards of partial rollouts, for strategies that need them (trees)."""
        idx = prompt_index.tolist()
        cols = {c: [picked[i][c] for i in idx] for c in picked[0]}
        result = reward_fn([texts[i] for i in idx], decode(tokenizer, rollouts), cols)
        return torch.as_tensor(result.total, dtype=torch.float32)

    def on_finished(i: int, token_ids: list[int]) -> None:
        """A response of prompt i ended: slow reward functions may start on it now."""
        completion = tokenizer.decode(token_ids, skip_special_tokens=True)
        reward_fn.prefetch([texts[i]], [completion], {c: [picked[i][c]] for c in picked[0]})

    t0 = time.perf_counter()
    strategy = ROLLOUT_STRATEGIES.get(config.rollout.strategy)
    rollouts, prompt_index = strategy(
        engine,
        ids,
        params,
        group_size=config.rollout.group_size,
        score=score,
        on_finished=on_finished if reward_fn.can_prefetch and prefetch_enabled(config) else None,
        **config.rollout.strategy_options,
    )
    n = len(rollouts)
    label = f"rollout strategy {config.rollout.strategy!r}"
    check_produced(label, strategy, rollouts.extras, n)
    check_declared_made(label, strategy, rollouts.extras)
    for a in config.rollout.annotators:
        annotator, label = ROLLOUT_ANNOTATORS.get(a.name), f"rollout annotator {a.name!r}"
        made = annotator(rollouts, **a.options)
        check_produced(label, annotator, made, n)
        check_declared_made(label, annotator, made)
        rollouts.add_extras(made)
    t1 = time.perf_counter()
    idx = prompt_index.tolist()
    completions = decode(tokenizer, rollouts)
    prompts = [texts[i] for i in idx]
    columns = {c: [picked[i][c] for i in idx] for c in picked[0]}
    ids = [
        row[:n]
        for row, n in zip(rollouts.response_ids.tolist(), rollouts.lengths.tolist(), strict=True)
    ]
    result = reward_fn(prompts, completions, columns, completion_ids=ids)
    # Declared structure from reward functions (RewardOutput): per rollout, or pairwise.
    pairwise = result.pairwise
    rollouts.add_extras({k: v for k, v in result.structure.items() if k not in pairwise})
    rollouts.add_extras({k: result.structure[k] for k in pairwise}, pairwise=True)
    raw = torch.as_tensor(result.total, dtype=torch.float32)
    task_name = task_function(config)
    per_function = {
        k: [0.0 if v is None else float(v) for v in vals] for k, vals in result.raw.items()
    }
    task = torch.tensor(per_function[task_name], dtype=torch.float32)
    other = torch.zeros_like(task)
    for name, _, weight in reward_fn.functions:
        if name != task_name:
            other += weight * torch.tensor(per_function[name], dtype=torch.float32)
    task_weight = next(w for name, _, w in reward_fn.functions if name == task_name)
    times.generation += t1 - t0
    times.scoring += time.perf_counter() - t1
    times.rounds += 1
    times.generated_tokens += rollouts.generated_tokens
    times.sampled_groups += len(indices)
    return Scored(
        rollouts=rollouts,
        group_ids=prompt_index + group_offset,
        prompts=prompts,
        completions=completions,
        columns=columns,
        task_rewards=task,
        task_weight=task_weight,
        other_rewards=other,
        raw_rewards=raw,
        correct=task >= config.reward.correct_threshold,
        rewards=raw,
        filter_rewards=task,
        per_function=per_function,
        unparseable=int(sum(result.unparseable.values())),
    )


def task_function(config: Config) -> str:
    """The reward function whose value is the task reward M: `reward.task_function`, else
    the one named "task", else the first."""
    names = [f.name for f in config.reward.functions]
    if config.reward.task_function is not None:
        return config.reward.task_function
    return "task" if "task" in names else names[0]


def prefetch_enabled(config: Config) -> bool:
    """`reward.prefetch`, with "auto" resolved: on when sampling leaves a CPU core free (the
    model is on an accelerator, or torch uses fewer threads than this process has cores)."""
    if config.reward.prefetch != "auto":
        return bool(config.reward.prefetch)
    if not config.model.device.startswith("cpu"):
        return True
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return torch.get_num_threads() < cores


def needs_hidden(config: Config) -> bool:
    """Shapers that read the policy's hidden states (GAR) ask the engine to keep them, by
    a `needs_hidden = True` attribute on their factory."""
    return any(getattr(SHAPERS.get(s.name), "needs_hidden", False) for s in config.reward.shapers)


_PER_ROLLOUT = (
    "group_ids",
    "task_rewards",
    "other_rewards",
    "raw_rewards",
    "correct",
    "rewards",
    "filter_rewards",
)


def select(s: Scored, keep: torch.Tensor) -> Scored:
    idx = keep.nonzero().squeeze(-1)
    pick = idx.tolist()
    return replace(
        s,
        rollouts=s.rollouts.select(idx),
        prompts=[s.prompts[i] for i in pick],
        completions=[s.completions[i] for i in pick],
        columns={k: [v[i] for i in pick] for k, v in s.columns.items()},
        per_function={k: [v[i] for i in pick] for k, v in s.per_function.items()},
        **{k: getattr(s, k)[idx] for k in _PER_ROLLOUT},
    )


def merge(parts: list[Scored], pad_id: int) -> Scored:
    """The rounds' rollouts stacked; shaping metrics averaged over the rounds."""
    if len(parts) == 1:
        return parts[0]
    keys = {k for p in parts for k in p.shaping_metrics}
    return replace(
        parts[0],
        rollouts=concat_rollouts([p.rollouts for p in parts], pad_id),
        prompts=[x for p in parts for x in p.prompts],
        completions=[x for p in parts for x in p.completions],
        columns={k: [x for p in parts for x in p.columns[k]] for k in parts[0].columns},
        per_function={
            k: [x for p in parts for x in p.per_function[k]] for k in parts[0].per_function
        },
        unparseable=sum(p.unparseable for p in parts),
        shaping_metrics={
            k: sum(p.shaping_metrics[k] for p in parts if k in p.shaping_metrics)
            / sum(k in p.shaping_metrics for p in parts)
            for k in keys
        },
        **{k: torch.cat([getattr(p, k) for p in parts]) for k in _PER_ROLLOUT},
    )


def collect_batch(
    *,
    next_indices: Callable[[int], list[int]],
    config: Config,
    pad_id: int,
    times: RolloutTimes,
    score_round: Callable[[list[int], int], Scored],
    target: int | None = None,
) -> tuple[Scored | None, dict[str, float]]:
    """Generate rounds of `target` prompts (default `prompts_per_step`; under data
    parallelism a rank's share) until enough groups pass the filters.

    `score_round` returns a round's rewards already shaped; the filters look at its
    `filter_rewards` (module docstring). Without dynamic sampling this is one round. With
    it, groups whose (shaped task) rewards are all equal are dropped and more prompts are
    sampled, for at most `max_sampling_rounds` rounds; the batch is then cut to
    `target` groups (or trained as it is, if still short).
    """
    alg = config.algorithm
    target = target or config.rollout.prompts_per_step
    filters = []
    if alg.dynamic_sampling:
        filters.append(GROUP_FILTERS.get("nonconstant"))
    if alg.group_filter is not None:
        filters.append(GROUP_FILTERS.get(alg.group_filter))
    rounds = alg.max_sampling_rounds if alg.dynamic_sampling else 1
    kept: list[Scored] = []
    all_rounds: list[Scored] = []
    n_groups = 0
    offset = 0
    for _ in range(rounds):
        scored = score_round(next_indices(target), offset)
        offset += target
        all_rounds.append(scored)
        keep = torch.ones(len(scored.rewards), dtype=torch.bool)
        for f in filters:
            keep &= f(scored.filter_rewards, scored.group_ids)
        if keep.any():
            kept.append(select(scored, keep))
            n_groups += int(torch.unique(scored.group_ids[keep]).numel())
        if n_groups >= target:
            break
    sampled = merge(all_rounds, pad_id)
    stats = {
        "filter/kept_groups": float(n_groups),
        "filter/sampled_groups": float(times.sampled_groups),
        "filter/rounds": float(times.rounds),
    }
    if not kept:
        return None, stats | _sample_stats(sampled)
    batch = merge(kept, pad_id)
    if alg.dynamic_sampling and n_groups > target:
        first = torch.unique(batch.group_ids)[:target]
        batch = select(batch, torch.isin(batch.group_ids, first))
    return batch, stats | _sample_stats(sampled)


def _sample_stats(s: Scored) -> dict[str, float]:
    """Reward and accuracy over everything sampled this step (before filtering)."""
    lengths = s.rollouts.lengths.float()
    entropy = {}
    if s.rollouts.has_entropy:  # the vllm engine may not compute them
        entropy["entropy"] = float(
            (s.rollouts.entropy * s.rollouts.response_mask).sum()
            / s.rollouts.response_mask.sum().clamp(min=1)
        )
    return entropy | {
        "leaves": float(len(s.rewards)),  # rollouts sampled (a tree's leaf count varies)
        # The weighted reward functions' total, before shaping (comparable across methods).
        "reward/mean": float(s.raw_rewards.mean()),
        "reward/std": float(s.raw_rewards.std()) if len(s.raw_rewards) > 1 else 0.0,
        "accuracy": float(s.correct.float().mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "truncated_fraction": float(s.rollouts.truncated.float().mean()),
        "unparseable": float(s.unparseable),
        **{f"reward/{k}": sum(v) / max(len(v), 1) for k, v in s.per_function.items()},
    }
