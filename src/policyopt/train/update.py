"""The policy update: mu passes of minibatch optimizer steps over one finished batch.

`update(loss, batch, opt)` takes the bound loss (`BoundLoss`), a batch with advantages and
a loss mask, and the optimization state; it knows no config and no method. Normalisers
(token and sequence counts) are those of the whole minibatch, so the summed micro-batch
losses and gradients equal one pass over the minibatch (see core.aggregation). Under data
parallelism the minibatch is the union of every rank's rows: normalisers are summed over
ranks, gradients summed by the wrapper, and the micro-batch passes (replays included) are
`distributed.MicroBatches`.

Rows that make more than one micro-batch go through them longest first (`lengths`), so that
each micro-batch is padded only to its own longest row; the normalisers being global, the
loss and gradient are those of the batch's own order up to float summation order. Metrics
this module adds to the step's:

- `padded_fraction`: of the positions of the [rows, prompt + response] micro-batch tensors
  the update's forwards ran on (old and reference log-probs included), the share that is
  padding: what smaller micro-batches (`train.micro_batch_size`) could still save.
- `logp_gap_mean`, `logp_gap_max`: |log π_old − log π_sampler| over the loss's tokens, the
  gap between the trainer's log-probs and the sampler's that truncated importance sampling
  corrects (core/tis.py); reported where that gap is not zero by construction: TIS on, or
  a bf16-mixed model (`models.precision`). π_old is the recomputed behaviour policy, or the
  policy at the minibatch's step on-policy (the same thing with one step per batch); with
  stale rollouts it is the sampler's own and the gap is 0.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from policyopt.core import aggregate, global_normalisers, kl_penalty
from policyopt.core.diagnostics import ratio_diagnostics
from policyopt.core.losses import LossInputs, Normalisers, apply_policy_loss
from policyopt.core.structure import gather
from policyopt.core.tis import ISWeights
from policyopt.models.precision import is_mixed
from policyopt.rollout.base import Rollouts, require_entropies
from policyopt.train.batch import Batch, consumer_structure, slice_structure, trim
from policyopt.train.distributed import Dist, MetricPool, MicroBatches, Padding, to_local_float

# How a KL term is averaged for a loss with its own normalisation (no `agg`: gspo, hispo):
# per sequence, then over sequences.
KL_AGG_DEFAULT = "seq-mean-token-mean"


@dataclass(frozen=True)
class BoundLoss:
    """A registered policy loss bound to its options, with the KL penalty of the objective.

    options: the loss's own keyword options (its clip range, `agg` where it takes one, and
    `algorithm.loss_options`); max_len: the constant of seq-mean-token-sum-norm."""

    name: str
    fn: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)
    max_len: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"

    @property
    def label(self) -> str:
        return f"policy loss {self.name!r}"

    @property
    def kl_agg(self) -> str:
        return self.options.get("agg", KL_AGG_DEFAULT)

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return apply_policy_loss(self.label, self.fn, inputs, **self.options)


@dataclass
class Optimization:
    """What the update steps: the policy, its optimizer and schedule, and their settings."""

    model: torch.nn.Module
    # (ids, mask, width) -> response log-probs: `distributed.PolicyForward`, maybe wrapped.
    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    dist: Dist = field(default_factory=Dist)
    # Log-probs of the KL reference, under `reference_context` if set (a LoRA policy with
    # its adapter disabled is the policy's own forward).
    reference: torch.nn.Module | None = None
    reference_context: Callable[[], AbstractContextManager[Any]] | None = None
    ppo_epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int = 64
    max_grad_norm: float | None = 1.0
    # Truncated importance sampling cap C (core/tis.py); None: off.
    tis_cap: float | None = None
    # Stale rollouts (rollout.staleness > 0): the old log-probs are the rollouts' sampling
    # log-probs (the behaviour policy's), not a recomputation with the current weights.
    behaviour_old_logp: bool = False
    # Optimizer updates skipped for a non-finite loss or gradient: in a row (a finite update
    # resets it; the trainer stops at optim.max_nonfinite_updates) and over the run.
    nonfinite_in_a_row: int = 0
    nonfinite_total: int = 0


class NonFiniteUpdateError(RuntimeError):
    """The loss or gradient was NaN or inf in `optim.max_nonfinite_updates` updates in a row."""


def update(loss: BoundLoss, batch: Batch, opt: Optimization) -> dict[str, float]:
    """mu epochs x minibatches optimizer steps of `loss` on `batch`; the update's metrics."""
    n = len(batch)
    everything = torch.arange(n)
    # The behaviour policy's log-probs are needed only when the policy moves during the
    # update; with one optimizer step per batch the ratio is exactly 1 and logp.detach()
    # gives the same loss and gradient (as TRL and verl do on-policy).
    off_policy = opt.ppo_epochs > 1 or opt.minibatches > 1
    padding = Padding()  # what the forwards below compute (module docstring)
    t_logprobs = time.perf_counter()
    if opt.behaviour_old_logp:
        old_logp = batch.rollouts.logp * batch.rollouts.response_mask
    else:
        old_logp = batch_logprobs(opt.policy, batch, opt, padding) if off_policy else None
    ref_logp = None
    if loss.kl_coef > 0:
        assert opt.reference is not None, "a KL penalty needs a reference policy"
        with opt.reference_context() if opt.reference_context is not None else nullcontext():
            ref_logp = batch_logprobs(opt.reference, batch, opt, padding)
    # The no-grad passes before the update (behaviour and reference log-probs): the step's
    # time split reports them apart from the update's forward and backward.
    logprob_seconds = time.perf_counter() - t_logprobs
    pooled = MetricPool()
    grad_norms: list[float] = []
    skipped = 0
    opt.model.train()
    for _ in range(opt.ppo_epochs):
        order = torch.randperm(n) if opt.minibatches > 1 else everything
        for minibatch in order.chunk(opt.minibatches):
            metrics, tokens = minibatch_step(
                loss, batch, minibatch, opt, old_logp, ref_logp, padding
            )
            pooled.add(metrics, tokens)
            norm, stepped = optimizer_step(opt, loss_finite=math.isfinite(metrics["loss"]))
            grad_norms.append(norm)
            skipped += not stepped
    out = pooled.result()
    out["grad_norm"] = sum(grad_norms) / len(grad_norms)  # NaN when an update was skipped
    out["lr"] = opt.scheduler.get_last_lr()[0]
    out["nonfinite/skipped_updates"] = float(skipped)
    out["nonfinite/in_a_row"] = float(opt.nonfinite_in_a_row)
    out["nonfinite/total"] = float(opt.nonfinite_total)
    out["padded_fraction"] = padding.fraction(opt.dist)
    out["time/logprobs"] = logprob_seconds
    return out


def row_lengths(r: Rollouts) -> torch.Tensor:
    """The order micro-batches take rows in, longest first (`MicroBatches`): by response
    span (what `trim` pads responses to), then by prompt length."""
    return r.lengths * (r.prompt_mask.shape[1] + 1) + r.prompt_mask.sum(-1)


def batch_logprobs(
    policy: torch.nn.Module, batch: Batch, opt: Optimization, padding: Padding | None = None
) -> torch.Tensor:
    """No-grad log-probs of every row under `policy`, padded to the batch's width [N, R];
    what the forwards computed is counted in `padding`."""
    r = batch.rollouts
    out = torch.zeros(len(batch), r.response_ids.shape[1])
    passes = MicroBatches(
        opt.dist,
        torch.arange(len(batch)),
        opt.micro_batch_size,
        lengths=row_lengths(r),
        padding=padding,
    )
    with torch.no_grad():
        for rows in passes:
            ids, mask, width = trim(
                r.prompt_ids[rows], r.prompt_mask[rows], r.response_ids[rows], r.response_mask[rows]
            )
            passes.computed(mask)
            lp = policy(ids, mask, width, **allowed_of(r, rows, width))
            if passes.counts:
                out[rows, :width] = lp.float()
    return out


def allowed_of(r: Rollouts, rows: torch.Tensor, width: int) -> dict[str, torch.Tensor]:
    """The policy's `allowed_bits` keyword for rows `rows` when the rollouts were decoded
    under a grammar (the constrained distribution, `rollout/grammar.py`); none otherwise, so
    that a policy without the keyword is called as before."""
    if r.allowed_bits is None:
        return {}
    return {"allowed_bits": r.allowed_bits[rows, :width]}


def minibatch_step(
    loss: BoundLoss,
    batch: Batch,
    minibatch: torch.Tensor,
    opt: Optimization,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    padding: Padding | None = None,
) -> tuple[dict[str, float], float]:
    """Forward and backward of `loss` on rows `minibatch` in micro-batches; (metrics pooled
    over the micro-batches and ranks, token count). What the forwards computed is counted
    in `padding`."""
    r, loss_mask = batch.rollouts, batch.loss_mask
    assert loss_mask is not None and batch.advantages is not None, "an unfinished batch"
    # Normalisers of the whole minibatch (core's definition: a sequence whose loss is
    # masked out entirely, e.g. by overlong filtering, is not counted).
    tokens, seqs = opt.dist.sum(*global_normalisers(loss_mask[minibatch]))
    norms = Normalisers(global_tokens=tokens, global_seqs=seqs, max_len=loss.max_len)
    # Declared structure the loss needs (HISPO: segment ids, rollout-time entropies).
    wanted = gather(loss.label, loss.fn, consumer_structure(r))
    if "entropies" in wanted:
        require_entropies(r, loss.label)
    report_gap = opt.tis_cap is not None or is_mixed(opt.model)
    passes = MicroBatches(
        opt.dist,
        minibatch,
        opt.micro_batch_size,
        opt.policy,
        lengths=row_lengths(r),
        padding=padding,
    )
    for rows in passes:
        ids, mask, width = trim(
            r.prompt_ids[rows], r.prompt_mask[rows], r.response_ids[rows], r.response_mask[rows]
        )
        passes.computed(mask)
        logp = opt.policy(ids, mask, width, **allowed_of(r, rows, width))
        m = loss_mask[rows, :width]
        adv = batch.advantages[rows]
        if adv.dim() == 2:
            adv = adv[:, :width]
        old = logp.detach() if old_logp is None else old_logp[rows, :width]
        sampling = r.logp[rows, :width]
        inputs = LossInputs(
            logp=logp,
            old_logp=old,
            advantages=adv,
            mask=m,
            normalisers=norms,
            sampling_logp=sampling,
            is_weights=None if opt.tis_cap is None else ISWeights.of(old, sampling, m, opt.tis_cap),
            structure=slice_structure(wanted, r.pairwise, rows, width),
        )
        value, metrics = loss(inputs)
        if report_gap:
            metrics.update(logp_gap(old, sampling, m))
        if ref_logp is not None:
            kl = kl_penalty(logp, ref_logp[rows, :width], loss.kl_estimator)
            kl_loss = aggregate(
                kl,
                m,
                loss.kl_agg,
                global_tokens=norms.global_tokens,
                global_seqs=norms.global_seqs,
                max_len=norms.max_len,
            )
            value = value + loss.kl_coef * kl_loss
            metrics["kl_ref"] = float((kl.detach() * m).sum() / m.sum().clamp(min=1))
        segments = r.structure.get("segment_ids")
        segments = None if segments is None else segments[rows, :width]
        metrics.update(ratio_diagnostics(logp, old, m, segments))
        passes.backward(value, metrics, float(m.sum()))
    return passes.result()


def logp_gap(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean and max of |log π_old − log π_sampler| over the tokens of `mask` [n, T] (module
    docstring); MetricPool pools the mean by tokens, the max by max."""
    gap = (old.detach().float() - sampling.float()).abs() * mask
    return {
        "logp_gap_mean": float(gap.sum() / mask.sum().clamp(min=1)),
        "logp_gap_max": float(gap.max()) if gap.numel() else 0.0,
    }


def optimizer_step(opt: Optimization, loss_finite: bool) -> tuple[float, bool]:
    """Clip the gradient and step; returns (gradient norm, whether the optimizer stepped).

    A non-finite loss or gradient norm (any NaN or inf gradient makes the norm non-finite)
    skips the optimizer step, so neither the parameters nor the optimizer's moments ever see
    it, and is counted in `opt`. The lr schedule advances either way: it counts updates."""
    params = [p for p in opt.model.parameters() if p.requires_grad]
    max_norm = opt.max_grad_norm
    norm = to_local_float(
        torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    )
    stepped = loss_finite and math.isfinite(norm)
    if stepped:
        opt.optimizer.step()
        opt.nonfinite_in_a_row = 0
    else:
        opt.nonfinite_in_a_row += 1
        opt.nonfinite_total += 1
    with warnings.catch_warnings():
        # torch warns when the schedule steps before any optimizer step (a skipped first one).
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
        opt.scheduler.step()
    opt.optimizer.zero_grad(set_to_none=True)
    return norm, stepped
