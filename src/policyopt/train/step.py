"""One training step, top to bottom: rollout -> score -> shape -> filter -> advantage -> update.

    for round in range(max_rounds):           # dynamic sampling is this loop
        batch = rollout(prompts)              # 1 strategy + annotators
        batch = score(batch)                  # 2a reward functions (the verifier)
        batch = shape(batch)                  # 2b shapers
        kept += filter(batch)                 # 3 group filters
    batch = advantage(concat(kept))           # 4 estimator, loss mask
    update(loss, batch, optimization)         # 5 -> optimizer.step()

`train_step(parts, state)` is that loop; each stage is a function of this module on the one
`Batch`. The parts come bound from `policyopt.train.parts`; the state is what the step
acts on (engine, sampler, policy, optimizer). Group filters look at the task reward after
the shapers that transform it (`rewards["M_shaped"]`: GAR's bonus, DocPO's annealed M),
not at the additive terms (other weighted functions, DAPO's overlong penalty): DAPO drops
the groups whose accuracy is 0 or 1 (arXiv 2503.14476, §3.2) also when the length penalty
makes their rewards differ, while a group whose rollouts are all correct keeps GAR's bonus.

Stale rollouts (`rollout.staleness: k`): asynchronous trainers (prime-rl, AReaL) generate
with a policy one or more versions behind the one they update. Here that lag is exact in one
process: every step samples a batch with the current policy and appends it to a FIFO
(`StepState.stale`), and trains on the oldest batch there, which the policy of k steps
earlier sampled. The first step fills the FIFO with k batches of the initial policy first,
so step t trains on rollouts of staleness min(t, k), as an asynchronous trainer's first
steps use the initial policy's rollouts. The loss's "old" log-probs are then the stored
sampling log-probs (the behaviour policy's). A version is one step, whatever the number of
optimizer updates in it. The FIFO is not checkpointed (it holds rollouts, not the model's
tensors): a resumed run refills it from the resumed policy, as at the start of a run.
k = 0 is the on-policy step: the FIFO holds this step's batch only.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from policyopt.core.advantages import estimator_with_metrics
from policyopt.core.diagnostics import rollout_diagnostics
from policyopt.core.structure import check_declared_made, check_produced, gather
from policyopt.rewards.shaping import ShapingContext
from policyopt.rollout.base import RolloutEngine, Rollouts
from policyopt.train.batch import Batch, consumer_structure
from policyopt.train.distributed import Dist, full_weights, global_rows, rank_slice
from policyopt.train.parts import Parts
from policyopt.train.prompts import PromptSampler, decode, encode_prompts
from policyopt.train.update import Optimization, update


@dataclass
class StepState:
    """What a step acts on, and the one holder of it: the model, policy and optimizer
    (`optimization`), the engine and the tokenizer. `step` counts the steps done; `share` is
    this rank's prompts per round (`prompts_per_step` without data parallelism)."""

    step: int
    rows: Any  # the task's training rows (a datasets.Dataset)
    sampler: PromptSampler
    engine: RolloutEngine
    tokenizer: Any
    pad_id: int
    share: int
    optimization: Optimization
    dist: Dist = field(default_factory=Dist)
    # rollout.staleness: (step that sampled it, kept batch) not yet trained on, oldest first
    stale: deque[tuple[int, Batch | None]] = field(default_factory=deque)


@dataclass(frozen=True)
class RoundPrompts:
    """A sampling round's prompts as the reward functions see them (their text and their
    rows' columns), with what scoring a response needs. A strategy that scores partial
    rollouts (DATPO's tree) is handed `verify`; an engine that passes each finished
    response on to slow reward functions early is handed `prefetch`: explicit objects that
    hold what they need, not closures over the rollout stage's locals."""

    texts: list[str]
    rows: list[dict[str, Any]]
    tokenizer: Any
    reward: Any  # the run's RewardPipeline

    def columns(self, idx: list[int]) -> dict[str, list[Any]]:
        return {c: [self.rows[i][c] for i in idx] for c in self.rows[0]}

    def verify(self, rollouts: Rollouts, prompt_index: torch.Tensor) -> torch.Tensor:
        """The weighted rewards of (partial) rollouts of prompts `prompt_index`."""
        idx = prompt_index.tolist()
        completions = decode(self.tokenizer, rollouts)
        result = self.reward([self.texts[i] for i in idx], completions, self.columns(idx))
        return torch.as_tensor(result.total, dtype=torch.float32)

    def prefetch(self, i: int, token_ids: list[int]) -> None:
        """A response of prompt i ended: slow reward functions may start on it now."""
        completion = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        self.reward.prefetch([self.texts[i]], [completion], self.columns([i]))


@dataclass
class Times:
    generation: float = 0.0
    scoring: float = 0.0
    rounds: int = 0
    generated_tokens: int = 0
    sampled_groups: int = 0


def train_step(parts: Parts, state: StepState) -> tuple[Batch | None, dict[str, float]]:
    """One step; the trained batch (None if no group passed the filters) and its metrics.

    With `rollout.staleness` k > 0 the step trains on the batch sampled k steps earlier
    (module docstring); the sampling metrics are those of this step's batch."""
    t_start = time.perf_counter()
    times = Times()
    while len(state.stale) <= parts.staleness:  # one batch, or k + 1 to fill the FIFO first
        sampled, metrics = sample(parts, state, times)
        state.stale.append((state.step, sampled))
    version, kept = state.stale.popleft()
    metrics["mech/staleness"] = float(state.step - version)
    # Every rank updates, or none does (each update pass is a collective).
    (ready,) = state.dist.sum(float(kept is not None))
    t_update = time.perf_counter()
    trained = None
    if ready < state.dist.world:
        metrics["skipped_update"] = 1.0
    else:
        assert kept is not None
        trained = advantage(parts, state.dist, kept)
        metrics.update(trained.metrics)
        metrics["advantage/abs_mean"] = float(trained.advantages.abs().mean())
        metrics["reward/shaped_mean"] = float(trained.rewards["total"].mean())
        metrics.update(mechanism_stats(parts, trained))
        metrics.update(update(parts.loss, trained, state.optimization))
        state.engine.sync_weights()
    t_end = time.perf_counter()
    metrics.update(
        {
            "time/generation": times.generation,
            "time/scoring": times.scoring,
            "time/training": t_end - t_update,
            "time/step": t_end - t_start,
            "generated_tokens": float(times.generated_tokens),
            "tokens_per_s": times.generated_tokens / max(t_end - t_start, 1e-9),
        }
    )
    return trained, metrics


def sample(parts: Parts, state: StepState, times: Times) -> tuple[Batch | None, dict[str, float]]:
    """1-3: rounds of rollout, score, shape and filter until enough groups are kept (one
    round without dynamic sampling); the kept batch (None if none) and the sampling
    metrics."""
    kept: list[Batch] = []
    sampled: list[Batch] = []
    n_groups = 0
    with full_weights(state.optimization.policy):  # FSDP2: sample from whole layers
        for k in range(parts.max_rounds):  # dynamic sampling: more rounds until enough groups
            # Every rank draws the round's global prompts and keeps its share of them.
            indices = rank_slice(state.sampler.take(state.share * state.dist.world), state.dist)
            batch = rollout(parts, state, indices, k * state.share, times)
            batch = score(parts, batch, times)
            batch = shape(parts, state, batch)
            parts.task.end_of_round()  # a live world moves on after its round is scored
            sampled.append(batch)
            keep = group_filter(parts, batch)
            if keep.any():
                kept.append(batch.select(keep))
                n_groups += int(torch.unique(batch.group_ids[keep]).numel())
            if n_groups >= state.share:
                break
    metrics = {
        "filter/kept_groups": float(n_groups),
        "filter/sampled_groups": float(times.sampled_groups),
        "filter/rounds": float(times.rounds),
        **sample_stats(Batch.concat(sampled, state.pad_id)),
    }
    if not kept:
        return None, metrics
    trained = Batch.concat(kept, state.pad_id)
    if parts.dynamic_sampling and n_groups > state.share:  # cut to the target
        first = torch.unique(trained.group_ids)[: state.share]
        trained = trained.select(torch.isin(trained.group_ids, first))
    return trained, metrics


def mechanism_stats(parts: Parts, b: Batch) -> dict[str, float]:
    """Rollout-side mechanism metrics of the trained batch (`core.diagnostics`)."""
    r = b.rollouts
    assert b.correct is not None
    entropies = r.entropies if r.has_entropies else None  # the vllm engine may not have them
    return {
        **rollout_diagnostics(
            entropies,
            r.response_mask,
            b.group_ids,
            b.correct.tolist(),
            [parts.task.extract_answer(c) for c in b.completions],
            r.structure.get("segment_ids"),
        ),
        "mech/response_length": float(r.lengths.float().mean()),
    }


def rollout(
    parts: Parts, state: StepState, indices: list[int], group_offset: int, times: Times
) -> Batch:
    """1. The strategy's rollouts of training rows `indices` (G per prompt, or a tree), the
    annotators' structure, and the decoded completions."""
    picked = [state.rows[i] for i in indices]
    texts, ids = encode_prompts(parts.task, state.tokenizer, picked, parts.chat_template)
    prompts = RoundPrompts(texts, picked, state.tokenizer, parts.reward)
    t0 = time.perf_counter()
    strategy = parts.strategy
    rollouts, prompt_index = strategy.fn(
        state.engine,
        ids,
        parts.sampling,
        group_size=parts.group_size,
        score=prompts.verify,
        on_finished=prompts.prefetch if parts.prefetch else None,
        rows=picked,
        **strategy.options,
    )
    n = len(rollouts)
    # What a producer made can only be checked now, on the values (their shapes, that each
    # declared name was made); that every need has an earlier producer was checked once,
    # from the config (`policyopt.config.check`).
    check_produced(strategy.label, strategy.fn, rollouts.structure, n)
    check_declared_made(strategy.label, strategy.fn, rollouts.structure)
    for a in parts.annotators:
        made = a.fn(rollouts, **a.options)
        check_produced(a.label, a.fn, made, n)
        check_declared_made(a.label, a.fn, made)
        rollouts = rollouts.with_structure(made)
    times.generation += time.perf_counter() - t0
    times.rounds += 1
    times.generated_tokens += rollouts.generated_tokens
    times.sampled_groups += len(indices)
    idx = prompt_index.tolist()
    return Batch(
        rollouts=rollouts,
        group_ids=prompt_index + group_offset,
        prompts=[texts[i] for i in idx],
        completions=decode(state.tokenizer, rollouts),
        columns=prompts.columns(idx),
    )


def score(parts: Parts, batch: Batch, times: Times) -> Batch:
    """2a. The reward functions: each one's values, their weighted total, the task term M
    and the other functions' weighted sum; their declared structure joins the batch's."""
    t0 = time.perf_counter()
    r = batch.rollouts
    ids = [row[:n] for row, n in zip(r.response_ids.tolist(), r.lengths.tolist(), strict=True)]
    result = parts.reward(
        batch.prompts,
        batch.completions,
        batch.columns,
        completion_ids=ids,
        structure=batch.structure,  # a function that needs some (`environment_reward`)
    )
    pairwise = result.pairwise
    batch = batch.with_structure({k: v for k, v in result.structure.items() if k not in pairwise})
    batch = batch.with_structure({k: result.structure[k] for k in pairwise}, pairwise=True)
    values = {
        name: torch.tensor([0.0 if v is None else float(v) for v in vals], dtype=torch.float64)
        for name, vals in result.raw.items()
    }
    task = values[parts.task_function].float()  # M
    other = torch.zeros_like(task)  # the other functions' terms, weighted once by the pipeline
    for name, term in result.weighted.items():
        if name != parts.task_function:
            other += term
    times.scoring += time.perf_counter() - t0
    weighted = torch.as_tensor(result.total, dtype=torch.float32)
    rewards = {f"function/{k}": v for k, v in values.items()}
    rewards |= {"weighted": weighted, "M": task, "other": other}
    rewards |= {"M_shaped": task, "total": weighted}  # until `shape`
    return replace(
        batch,
        rewards=rewards,
        correct=task >= parts.correct_threshold,
        unparseable=int(sum(result.unparseable.values())),
    )


def shape(parts: Parts, state: StepState, batch: Batch) -> Batch:
    """2b. The shapers on the task term M, in order (composition: `policyopt.rewards.
    shaping`), then R = w_task · M' + Σ other weighted functions + Σ shaper terms."""
    ctx = ShapingContext(
        batch,
        step=state.step,
        total_steps=parts.total_steps,
        model=state.optimization.model,
        tokenizer=state.tokenizer,
        logit_chunk_size=parts.logit_chunk_size,
        max_new_tokens=parts.max_new_tokens,
    )
    task = batch.rewards["M"]
    metrics: dict[str, float] = {}
    for part, shaper in parts.shapers:
        before = dict(ctx.structure)
        task, m = shaper(task, ctx)
        metrics.update(m)
        new = {k: v for k, v in ctx.structure.items() if before.get(k) is not v}
        check_produced(part.label, part.fn, new, len(task))
        check_declared_made(part.label, part.fn, ctx.structure)
    task = task.float()
    total = parts.task_weight * task + batch.rewards["other"]
    rewards = {**batch.rewards, "M_shaped": task}
    for name, term in ctx.terms.items():
        rewards[f"term/{name}"] = term.float()
        total = total + term.float()
    rewards["total"] = total
    return replace(ctx.batch, rewards=rewards, metrics=metrics)  # with what shapers declared


def group_filter(parts: Parts, batch: Batch) -> torch.Tensor:
    """3. Which rollouts' groups pass every group filter (bool [N]), on the shaped task term."""
    keep = torch.ones(len(batch), dtype=torch.bool)
    for f in parts.filters:
        keep &= f(batch.rewards["M_shaped"], batch.group_ids)
    return keep


def advantage(parts: Parts, dist: Dist, batch: Batch) -> Batch:
    """4. Advantages of the step's rewards R, and the loss mask."""
    est = parts.advantage
    wanted = gather(est.label, est.fn, consumer_structure(batch.rollouts))
    rewards, group_ids, mine = batch.rewards["total"], batch.group_ids, slice(None)
    if not wanted:
        # Estimators of rewards alone see the global batch (REINFORCE++'s batch std); those
        # that read declared structure (DATPO's blocks, SRPO's distances) are per group, so
        # per rank (a group never spans ranks).
        rewards, group_ids, mine = global_rows(dist, rewards, group_ids)
    # An estimator may report metrics (e.g. srpo/saturation).
    advantages, reported = estimator_with_metrics(
        est.label, est.fn, rewards, group_ids, **wanted, **est.options
    )
    advantages = advantages[mine]
    loss_mask = batch.rollouts.response_mask
    if parts.filter_truncated:  # DAPO's overlong filtering
        loss_mask = loss_mask * (~batch.rollouts.truncated).float()[:, None]
    metrics = {**batch.metrics, **reported}
    return replace(batch, advantages=advantages, loss_mask=loss_mask, metrics=metrics)


def sample_stats(b: Batch) -> dict[str, float]:
    """Reward and accuracy over everything sampled this step (before filtering)."""
    r = b.rollouts
    lengths = r.lengths.float()
    entropy = {}
    if r.has_entropies:  # the vllm engine may not compute them
        entropy["entropy"] = float(
            (r.entropies * r.response_mask).sum() / r.response_mask.sum().clamp(min=1)
        )
    weighted = b.rewards["weighted"]
    assert b.correct is not None
    return entropy | {
        "leaves": float(len(b)),  # rollouts sampled (a tree's leaf count varies)
        # The weighted reward functions' total, before shaping (comparable across methods).
        "reward/mean": float(weighted.mean()),
        "reward/std": float(weighted.std()) if len(weighted) > 1 else 0.0,
        "accuracy": float(b.correct.float().mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "truncated_fraction": float(r.truncated.float().mean()),
        "unparseable": float(b.unparseable),
        **{f"reward/{k}": sum(v.tolist()) / max(len(v), 1) for k, v in b.function_values().items()},
    }
