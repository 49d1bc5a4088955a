"""HISPO's segment-level clipped surrogate (arXiv 2609.15471; SPEC section 2, steps 6-9).

Each response y_i is split into contiguous segments S_{i,1..K_i} (built at rollout time from
the behaviour policy's token entropies, `policyopt.methods.hispo.build_segments`). With
log ρ_{i,t} = logp − old_logp, H_{i,t} the rollout-time entropy and Â_i the sequence
advantage:

    μ_{i,k}  = exp( (1/|S_k|) Σ_{t∈S_k} log ρ_{i,t} )          segment ratio (geometric mean)
    H̄_{i,k}  = (1/|S_k|) Σ_{t∈S_k} H_{i,t}                      mean segment entropy
    w_{i,k}  = softmax_k(H̄_{i,k})                               saliency, over row i's segments
    Â_{i,k}  = w_{i,k} / max(|S_k|, L_min) · Â_i                 segment advantage
    J        = (1/G) Σ_i Σ_k |S_k| · min(μ Â_{i,k}, clip(μ, 1−ε_low, 1+ε_high) Â_{i,k})
    loss     = −J

G is the number of responses of the global batch (`global_seqs`, for micro-batch
invariance). Where unclipped, ∂J/∂log π(y_t) = Â_i μ_{i,k} w_{i,k} / (G |S_k|) for t ∈ S_k
(when |S_k| ≥ L_min). With one segment per response J is GSPO's objective; with one token
per segment μ is the token ratio ρ.

Segments are the tokens of a row sharing a `segment_ids` value (only tokens of `mask`
count, so |S_k| is the number of valid tokens; a segment with none is absent). Entropies
are constants of the rollout: no gradient flows through w.
"""

from __future__ import annotations

import torch
from torch import Tensor

from policyopt.core.aggregation import aggregate
from policyopt.core.losses import (
    MAX_LOG_RATIO,
    POLICY_LOSSES,
    LossInputs,
    _check_clip,
    clipped_surrogate,
    loss_metrics,
)
from policyopt.core.structure import needs


def segment_sums(values: Tensor, segment_ids: Tensor, mask: Tensor, n_segments: int) -> Tensor:
    """Σ_{t∈S_k} values_{i,t} over the valid tokens of each (row i, segment k): [N, K]."""
    index = torch.where(mask, segment_ids, 0)
    src = torch.where(mask, values, 0.0)
    out = torch.zeros(values.shape[0], n_segments, dtype=values.dtype, device=values.device)
    return out.scatter_add(1, index, src)


def check_segment_ids(segment_ids: Tensor | None, mask: Tensor) -> Tensor:
    """Validate `segment_ids` [N, T] (integers >= 0 on valid tokens); return them as long."""
    if segment_ids is None:
        raise ValueError(
            "the hispo loss needs segment_ids: add the 'hispo_segments' annotator to "
            "rollout.annotators (the hispo preset does)"
        )
    if not isinstance(segment_ids, Tensor) or segment_ids.shape != mask.shape:
        got = tuple(segment_ids.shape) if isinstance(segment_ids, Tensor) else segment_ids
        raise ValueError(f"segment_ids must have the mask's shape {tuple(mask.shape)}, got {got}")
    if segment_ids.is_floating_point() or segment_ids.is_complex():
        raise ValueError(f"segment_ids must hold integers, got dtype {segment_ids.dtype}")
    segment_ids = segment_ids.long()
    if bool((segment_ids[mask] < 0).any()):
        raise ValueError("segment_ids must be >= 0 on valid tokens")
    return segment_ids


@POLICY_LOSSES.register("hispo")
@needs("segment_ids", "entropies")
def hispo_loss(
    inputs: LossInputs,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    min_segment_len: float = 16,
) -> tuple[Tensor, dict[str, float]]:
    """HISPO loss −J (module docstring); its own normalisation (no `agg`); importance
    weights per sequence, on each response's term.

    inputs.structure: `segment_ids` [N, T] integer segment of every token (any value on
    padding), `entropies` [N, T] rollout-time token entropies H (no gradient).
    min_segment_len: L_min of the segment advantage (paper: 16).
    Metrics besides `loss_metrics` (whose ratio stats are over the segment ratios μ):
    `segments_per_response`, `mean_segment_length`, `segment_clipfrac` (fraction of
    segments whose clipped branch is active).
    """
    logp, old_logp, advantages, mask = inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask
    segment_ids = inputs.structure.get("segment_ids")
    entropies = inputs.structure.get("entropies")
    global_seqs = inputs.normalisers.global_seqs
    _check_clip(clip_low, clip_high)
    if min_segment_len < 0:
        raise ValueError(f"min_segment_len must be >= 0, got {min_segment_len}")
    if advantages.dim() != 1:
        raise ValueError("the hispo loss needs one advantage per response [N], got [N, T]")
    if not isinstance(entropies, Tensor) or entropies.shape != mask.shape:
        raise ValueError(
            f"the hispo loss needs rollout entropies of the mask's shape {tuple(mask.shape)}"
        )
    seg = check_segment_ids(segment_ids, mask)
    n_segments = int(seg[mask].max()) + 1 if bool(mask.any()) else 1  # K (max over rows)
    log_ratio = logp - old_logp  # log ρ_{i,t}, 0 on padding
    ent = entropies.detach().to(logp.dtype)

    size = segment_sums(mask.to(logp.dtype), seg, mask, n_segments)  # |S_{i,k}|, [N, K]
    present = size > 0
    n = size.clamp(min=1)
    log_mu = (segment_sums(log_ratio, seg, mask, n_segments) / n).clamp(
        -MAX_LOG_RATIO, MAX_LOG_RATIO
    )
    mu = log_mu.exp()  # μ_{i,k}
    mean_ent = segment_sums(ent, seg, mask, n_segments) / n  # H̄_{i,k}
    w = torch.softmax(mean_ent.masked_fill(~present, float("-inf")), dim=-1)  # w_{i,k}
    w = torch.where(present, w, 0.0)  # rows without valid tokens: softmax of all -inf = NaN
    adv_seg = w / size.clamp(min=min_segment_len).clamp(min=1) * advantages[:, None]  # Â_{i,k}
    loss_seg = size * clipped_surrogate(mu, adv_seg, clip_low, clip_high)  # −|S| min(...)
    # Σ_i Σ_k (...) / G over responses with at least one valid token.
    has_tokens = present.any(dim=-1)
    isw = inputs.is_weights
    per_response = torch.where(present, loss_seg, 0.0).sum(-1, keepdim=True)
    loss = aggregate(
        per_response if isw is None else per_response * isw.sequence[:, None],
        has_tokens[:, None],
        "seq-mean-token-sum",
        global_seqs=global_seqs,
    )

    mu_tok = mu.gather(1, torch.where(mask, seg, 0))  # each token's segment ratio
    adv_tok = advantages[:, None].expand(mask.shape)
    metrics = loss_metrics(mu_tok, adv_tok, log_ratio, mask, clip_low, clip_high, mu[present])
    metrics.update(_segment_metrics(mu, adv_seg, size, present, has_tokens, clip_low, clip_high))
    if isw is not None:
        metrics["tis_weight_mean"] = isw.sequence_mean()
    return loss, metrics


@torch.no_grad()
def _segment_metrics(
    mu: Tensor,
    adv_seg: Tensor,
    size: Tensor,
    present: Tensor,
    has_tokens: Tensor,
    clip_low: float,
    clip_high: float,
) -> dict[str, float]:
    """Segments per response, mean segment length, fraction of segments clipped."""
    n_seg = present.sum().clamp(min=1)
    clipped = ((mu < 1.0 - clip_low) & (adv_seg < 0)) | ((mu > 1.0 + clip_high) & (adv_seg > 0))
    values = torch.stack(
        [
            present.sum().double() / has_tokens.sum().clamp(min=1),
            size.sum().double() / n_seg,
            (clipped & present).sum().double() / n_seg,
        ]
    ).tolist()
    keys = ("segments_per_response", "mean_segment_length", "segment_clipfrac")
    return dict(zip(keys, values, strict=True))
