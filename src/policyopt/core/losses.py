"""Clipped policy-gradient losses, token level (PPO/GRPO/DAPO) and sequence level (GSPO).

Notation: ρ_{i,t} = π_θ(y_{i,t}) / π_old(y_{i,t}) = exp(logp − old_logp) is the token ratio,
Â the advantage (per sequence [N] or per token [N, T]), ε_low / ε_high the clip range.

- `ppo_clip` (PPO, arXiv 1707.06347; GRPO, arXiv 2402.03300; DAPO's clip-higher,
  arXiv 2503.14476): ℓ_{i,t} = −min(ρ Â, clip(ρ, 1−ε_low, 1+ε_high) Â), aggregated with `agg`.
  Optional dual clip (Ye et al. 2020, arXiv 1912.09729, as in verl): for Â < 0 the loss is
  also capped at −c Â, c = `clip_ratio_c` > 1.
- `gspo` (GSPO, arXiv 2507.18071): sequence ratio s_i = exp((1/T_i) Σ_t log ρ_{i,t}),
  ℓ_i = −min(s_i Â_i, clip(s_i, 1−ε_low, 1+ε_high) Â_i), mean over sequences. Variant
  `token` (GSPO-token): s_{i,t} = sg[s_i] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})], same value as s_i
  with a per-token gradient path, which admits per-token advantages; aggregated
  seq-mean-token-mean. GSPO's normalisation is part of its objective, so it takes no `agg`
  (both variants; a configured `algorithm.agg` with it is a config error) and uses only
  the `global_seqs` normaliser.

Each loss's keyword defaults (clip_low / clip_high, agg) are its paper's defaults, and the
only place they live: the trainer's config fills an unset `algorithm.clip_low` etc. from
them (`policyopt.config.check.loss_settings`).

Each registered loss has the signature `(inputs: LossInputs, **options) -> (loss, metrics)`:
`LossInputs` carries the log-probs, old and sampling log-probs, advantages, mask (bool),
global normalisers, truncated importance weights (`policyopt.core.tis.ISWeights`, or None)
and the declared structure the loss needs; `compute_policy_loss` validates the inputs and
calls it. Each loss applies the importance weights at its own level, as verl's losses apply
`rollout_is_weights`: the token clip per token, GSPO's sequence variant and HISPO per
sequence (to the loss term, before aggregation). Metrics (python floats, computed without gradient, over this call's valid tokens):
`clipfrac_low` (fraction of tokens with ratio < 1−ε_low and Â < 0), `clipfrac_high`
(ratio > 1+ε_high and Â > 0), `approx_kl` (mean of the k3 estimator of KL(π_old || π_θ),
ρ − 1 − log ρ, unbiased and ≥ 0 for tokens sampled from π_old), `ratio_mean`, `ratio_min`,
`ratio_max` (token ratios; for GSPO the sequence ratios s_i).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from policyopt.core.advantages import reject_unknown_options
from policyopt.core.aggregation import Count, aggregate, as_bool_mask
from policyopt.core.registry import Registry
from policyopt.core.tis import ISWeights

LossFn = Callable[..., tuple[Tensor, dict[str, float]]]

# name -> loss(inputs: LossInputs, **options) -> (scalar loss, metrics)
POLICY_LOSSES: Registry[LossFn] = Registry("policy loss")

# log ρ is clamped to this range before exp so that a wild token cannot overflow to inf.
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class Normalisers:
    """Global counts for micro-batch invariance (`policyopt.core.aggregation.aggregate`):
    N_tok and N_seq of the whole (global) minibatch, and the constant length of
    seq-mean-token-sum-norm. None: those of the call's own mask."""

    global_tokens: Count | None = None
    global_seqs: Count | None = None
    max_len: int | None = None


@dataclass(frozen=True)
class LossInputs:
    """Everything a policy loss reads (shapes: N rows, T response positions).

    logp: [N, T] log π_θ (with gradient); old_logp: [N, T] log π_old (behaviour policy);
    advantages: [N] or [N, T]; mask: [N, T] bool or 0/1; sampling_logp: [N, T] the rollout
    engine's log-probs (or None); is_weights: truncated importance weights (or None: off);
    structure: declared structure the loss `@needs` (HISPO's segment ids and entropies).
    """

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    normalisers: Normalisers = Normalisers()
    sampling_logp: Tensor | None = None
    is_weights: ISWeights | None = None
    structure: dict[str, Tensor] = field(default_factory=dict)


def compute_policy_loss(
    name: str, inputs: LossInputs, **options: Any
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss (to minimise) and metrics of the policy loss registered as `name`.

    options: the loss's own options (e.g. `agg`, `clip_low`, `clip_high`)."""
    return apply_policy_loss(f"policy loss {name!r}", POLICY_LOSSES.get(name), inputs, **options)


def apply_policy_loss(
    what: str, fn: LossFn, inputs: LossInputs, /, **options: Any
) -> tuple[Tensor, dict[str, float]]:
    """`compute_policy_loss` for a loss already looked up (`what` names it in errors)."""
    reject_unknown_options(what, fn, options, skip=1)
    valid = check_loss_inputs(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask)
    # Padding may hold any value (even NaN); zero it so that neither the value nor the
    # gradient of a masked position can leak into the loss.
    clean = replace(
        inputs,
        logp=torch.where(valid, _float(inputs.logp), 0.0),
        old_logp=torch.where(valid, _float(inputs.old_logp), 0.0),
        advantages=_float(inputs.advantages),
        mask=valid,
    )
    return fn(clean, **options)


def weighted(loss: Tensor, weights: Tensor | None) -> Tensor:
    """The loss terms times the importance weights (no weights: unchanged)."""
    return loss if weights is None else loss * weights


def check_loss_inputs(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Validate shapes; return the mask as bool [N, T]."""
    if not isinstance(logp, Tensor) or logp.dim() != 2:
        raise ValueError(f"logp must be a 2-D tensor [N, T], got {_shape(logp)}")
    if not isinstance(old_logp, Tensor) or old_logp.shape != logp.shape:
        raise ValueError(
            f"old_logp must have logp's shape {tuple(logp.shape)}, got {_shape(old_logp)}"
        )
    if not isinstance(advantages, Tensor) or advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"advantages must have shape [N] = {tuple(logp.shape[:1])} or [N, T] = "
            f"{tuple(logp.shape)}, got {_shape(advantages)}"
        )
    return as_bool_mask(mask, logp.shape, "mask")


def clipped_surrogate(
    ratio: Tensor,
    adv: Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
) -> Tensor:
    """Element-wise −min(ratio Â, clip(ratio, 1−ε_low, 1+ε_high) Â), optionally dual-clipped."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        # Dual clip: for Â < 0 a huge ratio would give an unbounded loss; cap it at −c Â.
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    return loss


def _check_clip(clip_low: float, clip_high: float) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be non-negative, got {clip_high}")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    inputs: LossInputs,
    *,
    agg: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Token-level clipped surrogate ℓ_{i,t} = −min(ρ Â, clip(ρ) Â) (times the token's
    importance weight w_{i,t}), aggregated with `agg`."""
    _check_clip(clip_low, clip_high)
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1, got {clip_ratio_c}")
    mask, w = inputs.mask, inputs.is_weights
    adv = _per_token(inputs.advantages, mask)
    log_ratio = (inputs.logp - inputs.old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # log ρ
    ratio = log_ratio.exp()
    loss_mat = weighted(
        clipped_surrogate(ratio, adv, clip_low, clip_high, clip_ratio_c),
        None if w is None else w.token,
    )
    n = inputs.normalisers
    loss = aggregate(
        loss_mat,
        mask,
        agg,
        global_tokens=n.global_tokens,
        global_seqs=n.global_seqs,
        max_len=n.max_len,
    )
    metrics = loss_metrics(ratio, adv, log_ratio, mask, clip_low, clip_high, ratio[mask])
    if w is not None:
        metrics["tis_weight_mean"] = w.token_mean(mask)
    return loss, metrics


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    inputs: LossInputs,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    variant: str = "seq",
) -> tuple[Tensor, dict[str, float]]:
    """GSPO sequence-level clipped surrogate (its own normalisation: no `agg`); importance
    weights per sequence (variant seq) or per token (variant token)."""
    _check_clip(clip_low, clip_high)
    if variant not in ("seq", "token"):
        raise ValueError(f"gspo variant must be 'seq' or 'token', got {variant!r}")
    logp, mask, advantages, w = inputs.logp, inputs.mask, inputs.advantages, inputs.is_weights
    global_seqs = inputs.normalisers.global_seqs
    log_ratio = logp - inputs.old_logp  # log ρ_{i,t}, 0 on padding
    seq_len = mask.sum(dim=-1)  # T_i
    has_tokens = seq_len > 0
    # log s_i = (1/T_i) Σ_t log ρ_{i,t}
    log_s = (log_ratio.sum(dim=-1) / seq_len.clamp(min=1)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    s = log_s.exp()
    metrics: dict[str, float] = {}

    if variant == "seq":
        if advantages.dim() != 1:
            raise ValueError(
                "gspo variant 'seq' needs one advantage per sequence [N]; "
                "per-token advantages [N, T] need variant='token'"
            )
        loss_seq = weighted(
            clipped_surrogate(s, advantages, clip_low, clip_high), None if w is None else w.sequence
        )  # ℓ_i, [N]
        # Σ_i ℓ_i / N_seq over sequences with at least one valid token.
        loss = aggregate(
            loss_seq[:, None], has_tokens[:, None], "seq-mean-token-sum", global_seqs=global_seqs
        )
        ratio_tok = s[:, None].expand_as(logp)
        if w is not None:
            metrics["tis_weight_mean"] = w.sequence_mean()
    else:
        # s_{i,t} = sg[s_i] · π_θ(y_t)/sg[π_θ(y_t)]: value s_i, gradient s_i ∇log π_θ(y_t).
        log_s_tok = log_s.detach()[:, None] + logp - logp.detach()
        ratio_tok = log_s_tok.exp()
        loss_mat = weighted(
            clipped_surrogate(ratio_tok, _per_token(advantages, mask), clip_low, clip_high),
            None if w is None else w.token,
        )
        loss = aggregate(loss_mat, mask, "seq-mean-token-mean", global_seqs=global_seqs)
        if w is not None:
            metrics["tis_weight_mean"] = w.token_mean(mask)

    metrics = (
        loss_metrics(
            ratio_tok,
            _per_token(advantages, mask),
            log_ratio,
            mask,
            clip_low,
            clip_high,
            s[has_tokens],
        )
        | metrics
    )
    return loss, metrics


@torch.no_grad()
def loss_metrics(
    ratio: Tensor,
    adv: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    ratios: Tensor,
) -> dict[str, float]:
    """Clip fractions and approx KL over the valid tokens; min/mean/max of `ratios` (1-D)."""
    n_tok = mask.sum().clamp(min=1)
    clip_lo = (ratio < 1.0 - clip_low) & (adv < 0) & mask
    clip_hi = (ratio > 1.0 + clip_high) & (adv > 0) & mask
    lr = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    k3 = torch.where(mask, lr.exp() - 1.0 - lr, 0.0)  # KL(π_old || π_θ) estimator, ≥ 0
    if ratios.numel():
        stats = [ratios.mean(), ratios.min(), ratios.max()]
    else:
        stats = [ratio.new_zeros(())] * 3
    values = torch.stack(
        [clip_lo.sum() / n_tok, clip_hi.sum() / n_tok, k3.sum() / n_tok, *stats]
    ).tolist()  # one device sync for all metrics
    keys = ("clipfrac_low", "clipfrac_high", "approx_kl", "ratio_mean", "ratio_min", "ratio_max")
    return dict(zip(keys, values, strict=True))


def _per_token(advantages: Tensor, mask: Tensor) -> Tensor:
    """Advantages broadcast to [N, T]."""
    return advantages[:, None].expand(mask.shape) if advantages.dim() == 1 else advantages


def _float(x: Tensor) -> Tensor:
    """Half-precision inputs are promoted to float32: ratios near 1 need the precision."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _shape(x: object) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
