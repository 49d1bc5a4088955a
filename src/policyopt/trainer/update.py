"""The policy update: mu passes of minibatch optimizer steps over one rollout batch.

Normalisers (token and sequence counts) are those of the whole minibatch, so the summed
micro-batch losses and gradients equal one pass over the minibatch (see core.aggregation).
Under data parallelism (trainer.distributed) the minibatch is the union of every rank's
rows: the normalisers are summed over ranks, gradients summed by the wrapper, and every rank
runs as many micro-batch passes as the busiest one (extra passes weigh 0), since each DDP
or FSDP2 pass is a collective.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from policyopt.core import (
    POLICY_LOSSES,
    aggregate,
    compute_policy_loss,
    global_normalisers,
    kl_penalty,
)
from policyopt.core.structure import gather
from policyopt.core.tis import sequence_tis_weights, tis_weights
from policyopt.models.logprobs import response_logprobs
from policyopt.rollout.base import require_entropy
from policyopt.trainer.batch import StepBatch, micro_slices, trim
from policyopt.trainer.config import Config
from policyopt.trainer.distributed import Dist, grad_sync, to_local_float
from policyopt.trainer.structure import slice_structure, step_structure


@dataclass
class UpdateContext:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    config: Config
    # Reference log-probs come from this model, or from `model` under this context manager
    # (a LoRA policy with its adapter disabled).
    ref_model: torch.nn.Module | None = None
    ref_context: Any = None
    # Optimizer updates skipped for a non-finite loss or gradient: in a row (a finite update
    # resets it; the trainer stops at optim.max_nonfinite_updates) and over the run.
    nonfinite_in_a_row: int = 0
    nonfinite_total: int = 0
    # Truncated importance sampling cap C (core/tis.py); None: off.
    tis_cap: float | None = None
    # Data parallelism: `policy` / `ref_policy` map (ids, mask, width) to log-probs through
    # the DDP or FSDP2 wrapper (trainer.distributed.wrap_policy); None: call the models.
    dist: Dist = field(default_factory=Dist)
    policy: torch.nn.Module | None = None
    ref_policy: torch.nn.Module | None = None


class NonFiniteUpdateError(RuntimeError):
    """The loss or gradient was NaN or inf in `optim.max_nonfinite_updates` updates in a row."""


def _logprobs(
    wrapped: torch.nn.Module | None,
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    width: int,
    config: Config,
) -> torch.Tensor:
    if wrapped is not None:
        return wrapped(ids, mask, width)
    return response_logprobs(
        model,
        ids,
        mask,
        width,
        temperature=config.rollout.temperature,
        chunk_size=config.model.logit_chunk_size,
    ).logp


def _passes(dist: Dist, n_rows: int, size: int) -> list[tuple[slice, bool]]:
    """(rows, counts) of each micro-batch pass: this rank's slices, then replays of its last
    one that count for nothing, up to the number of passes of the busiest rank."""
    slices = micro_slices(n_rows, size)
    total = dist.max_int(len(slices))
    return [(slices[min(k, len(slices) - 1)], k < len(slices)) for k in range(total)]


def batch_logprobs(
    model: torch.nn.Module,
    batch: StepBatch,
    config: Config,
    index: torch.Tensor,
    *,
    wrapped: torch.nn.Module | None = None,
    dist: Dist | None = None,
) -> torch.Tensor:
    """No-grad log-probs of rows `index` under `model` (through `wrapped` if given), padded
    to the batch's width [n, R]."""
    r = batch.rollouts
    out = torch.zeros(len(index), r.response_ids.shape[1])
    with torch.no_grad():
        for sl, counts in _passes(dist or Dist(), len(index), config.train.micro_batch_size):
            rows = index[sl]
            ids, mask, width = trim(
                r.prompt_ids[rows], r.prompt_mask[rows], r.response_ids[rows], r.response_mask[rows]
            )
            lp = _logprobs(wrapped, model, ids, mask, width, config)
            if counts:
                out[sl, :width] = lp.float()
    return out


def policy_update(ctx: UpdateContext, batch: StepBatch) -> dict[str, float]:
    cfg = ctx.config
    alg = cfg.algorithm
    n = len(batch)
    everything = torch.arange(n)
    # The behaviour policy's log-probs are needed only when the policy moves during the
    # update; with one optimizer step per batch the ratio is exactly 1 and logp.detach()
    # gives the same loss and gradient (as TRL and verl do on-policy).
    off_policy = alg.ppo_epochs > 1 or alg.minibatches > 1
    old_logp = (
        batch_logprobs(ctx.model, batch, cfg, everything, wrapped=ctx.policy, dist=ctx.dist)
        if off_policy
        else None
    )
    ref_logp = None
    if alg.kl_coef > 0:
        ref = ctx.ref_model if ctx.ref_model is not None else ctx.model
        # A LoRA reference is the policy with its adapter off: the policy's wrapper then.
        ref_wrapped = ctx.ref_policy if ctx.ref_model is not None else ctx.policy
        with ctx.ref_context() if ctx.ref_context is not None else nullcontext():
            ref_logp = batch_logprobs(
                ref, batch, cfg, everything, wrapped=ref_wrapped, dist=ctx.dist
            )
    pooled = MetricPool()
    grad_norms: list[float] = []
    skipped = 0
    ctx.model.train()
    for _ in range(alg.ppo_epochs):
        order = torch.randperm(n) if alg.minibatches > 1 else everything
        for minibatch in order.chunk(alg.minibatches):
            metrics, tokens = _minibatch_step(ctx, batch, minibatch, old_logp, ref_logp)
            pooled.add(metrics, tokens)
            norm, stepped = _optimizer_step(ctx, loss_finite=math.isfinite(metrics["loss"]))
            grad_norms.append(norm)
            skipped += not stepped
    out = pooled.result()
    out["grad_norm"] = sum(grad_norms) / len(grad_norms)  # NaN when an update was skipped
    out["lr"] = ctx.scheduler.get_last_lr()[0]
    out["nonfinite/skipped_updates"] = float(skipped)
    out["nonfinite/in_a_row"] = float(ctx.nonfinite_in_a_row)
    out["nonfinite/total"] = float(ctx.nonfinite_total)
    return out


def _minibatch_step(
    ctx: UpdateContext,
    batch: StepBatch,
    minibatch: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
) -> tuple[dict[str, float], float]:
    cfg, alg, r = ctx.config, ctx.config.algorithm, batch.rollouts
    loss_mask = batch.loss_mask
    # Normalisers of the whole minibatch (core's definition: a sequence whose loss is
    # masked out entirely, e.g. by overlong filtering, is not counted).
    tokens, seqs = ctx.dist.sum(*global_normalisers(loss_mask[minibatch]))
    norms = {"global_tokens": tokens, "global_seqs": seqs, "max_len": cfg.rollout.max_new_tokens}
    # Declared structure the loss needs (HISPO: segment ids, rollout-time entropies).
    wanted = gather(f"policy loss {alg.loss!r}", POLICY_LOSSES.get(alg.loss), step_structure(r))
    if "entropies" in wanted:
        require_entropy(r, f"policy loss {alg.loss!r}")
    pooled = MetricPool()
    loss_sum = 0.0
    passes = _passes(ctx.dist, len(minibatch), cfg.train.micro_batch_size)
    for k, (sl, counts) in enumerate(passes):
        rows = minibatch[sl]
        ids, mask, width = trim(
            r.prompt_ids[rows], r.prompt_mask[rows], r.response_ids[rows], r.response_mask[rows]
        )
        with grad_sync(ctx.policy, last=k == len(passes) - 1):
            logp = _logprobs(ctx.policy, ctx.model, ids, mask, width, cfg)
        m = loss_mask[rows, :width]
        adv = batch.advantages[rows]
        if adv.dim() == 2:
            adv = adv[:, :width]
        old = logp.detach() if old_logp is None else old_logp[rows, :width]
        tis_mean = None
        if ctx.tis_cap is not None:
            adv, tis_mean = tis_advantages(
                adv, old, r.logp[rows, :width], m, ctx.tis_cap, per_sequence(cfg)
            )
        options = {**slice_structure(wanted, r.pairwise, rows, width), **alg.loss_options}
        loss, metrics = compute_policy_loss(
            alg.loss, logp, old, adv, m, **loss_settings(alg), **norms, **options
        )
        if ref_logp is not None:
            kl = kl_penalty(logp, ref_logp[rows, :width], alg.kl_estimator)
            # A loss with its own normalisation (gspo, hispo: no agg) averages the KL term
            # per sequence, then over sequences.
            kl_loss = aggregate(kl, m, alg.agg or "seq-mean-token-mean", **norms)
            loss = loss + alg.kl_coef * kl_loss
            metrics["kl_ref"] = float((kl.detach() * m).sum() / m.sum().clamp(min=1))
        if tis_mean is not None:
            metrics["tis_weight_mean"] = tis_mean
        if not counts:
            loss = loss * 0.0  # a replay that keeps this rank in step with the collectives
        loss.backward()
        if counts:
            pooled.add(metrics, float(m.sum()))
            loss_sum += float(loss.detach())  # micro losses sum to the minibatch loss
    pooled = pooled.merged(ctx.dist)
    out = pooled.result()
    (out["loss"],) = ctx.dist.sum(loss_sum)  # ranks' losses sum to the global one
    return out, pooled.tokens


def loss_settings(alg: Any) -> dict[str, Any]:
    """agg / clip_low / clip_high that are set; the others take the loss's own defaults."""
    values = {k: getattr(alg, k) for k in ("agg", "clip_low", "clip_high")}
    return {k: v for k, v in values.items() if v is not None}


def per_sequence(config: Config) -> bool:
    """Whether the loss takes one advantage per sequence (GSPO's sequence variant, HISPO)."""
    alg = config.algorithm
    if alg.loss == "gspo":
        return alg.loss_options.get("variant", "seq") == "seq"
    return alg.loss == "hispo"


def tis_advantages(
    adv: torch.Tensor,
    old: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    sequence_level: bool,
) -> tuple[torch.Tensor, float]:
    """Â weighted by the truncated importance weights (core/tis.py): per token, Â_i w_{i,t}
    [n, T]; for a loss with one advantage per sequence, Â_i w_i [n]. Also the mean weight
    over the masked tokens (or sequences)."""
    if sequence_level and adv.dim() == 1:
        w = sequence_tis_weights(old, sampler_logp, mask, cap)
        return adv * w, float(w.mean()) if len(w) else 1.0
    w = tis_weights(old, sampler_logp, mask, cap)
    full = adv[:, None] if adv.dim() == 1 else adv
    return full * w, float(w.sum() / mask.sum().clamp(min=1))


class MetricPool:
    """Pools per-part loss metrics into the whole's: `*_min` / `*_max` by min / max, the
    others (fractions and means over tokens) weighted by each part's token count."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.extremes: dict[str, float] = {}
        self.tokens = 0.0

    def add(self, metrics: dict[str, float], tokens: float) -> None:
        for k, v in metrics.items():
            if k.endswith("_min"):
                self.extremes[k] = min(self.extremes.get(k, float("inf")), float(v))
            elif k.endswith("_max"):
                self.extremes[k] = max(self.extremes.get(k, float("-inf")), float(v))
            else:
                self.sums[k] += float(v) * tokens
        self.tokens += tokens

    def merged(self, dist: Dist) -> MetricPool:
        """The pool of every rank's parts (itself without data parallelism)."""
        if not dist.active:
            return self
        whole = MetricPool()
        for sums, extremes, tokens in dist.gather((dict(self.sums), self.extremes, self.tokens)):
            for k, v in sums.items():
                whole.sums[k] += v
            for k, v in extremes.items():
                pick = min if k.endswith("_min") else max
                whole.extremes[k] = pick(whole.extremes.get(k, v), v)
            whole.tokens += tokens
        return whole

    def result(self) -> dict[str, float]:
        out = {k: v / max(self.tokens, 1.0) for k, v in self.sums.items()}
        out.update(self.extremes)
        return out


def _optimizer_step(ctx: UpdateContext, loss_finite: bool) -> tuple[float, bool]:
    """Clip the gradient and step; returns (gradient norm, whether the optimizer stepped).

    A non-finite loss or gradient norm (any NaN or inf gradient makes the norm non-finite)
    skips the optimizer step, so neither the parameters nor the optimizer's moments ever see
    it, and is counted in `ctx`. The lr schedule advances either way: it counts updates."""
    params = [p for p in ctx.model.parameters() if p.requires_grad]
    max_norm = ctx.config.optim.max_grad_norm
    norm = to_local_float(
        torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    )
    stepped = loss_finite and math.isfinite(norm)
    if stepped:
        ctx.optimizer.step()
        ctx.nonfinite_in_a_row = 0
    else:
        ctx.nonfinite_in_a_row += 1
        ctx.nonfinite_total += 1
    with warnings.catch_warnings():
        # torch warns when the schedule steps before any optimizer step (a skipped first one).
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
        ctx.scheduler.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return norm, stepped
