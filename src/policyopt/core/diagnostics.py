"""Mechanism metrics: what the update did, at the same levels for every loss.

With the token ratio ρ_{i,t} = exp(logp − old_logp) over the valid tokens (mask 1):

- ratio mean and std: over all valid tokens of the batch.
- KL(π_old ‖ π_θ): the mean over tokens of the k3 estimator ρ − 1 − log ρ (unbiased and ≥ 0
  for tokens sampled from π_old).
- clip fractions, one ε for all three levels so that methods compare (a diagnostic, not
  the loss's own clip, whose ε differs by method): the share of tokens with |ρ − 1| > ε;
  of segments with |μ_{i,k} − 1| > ε, μ_{i,k} = exp(mean_{t∈S_k} log ρ_{i,t}) (HISPO's
  segment ratio); and of responses with |s_i − 1| > ε, s_i = exp(mean_t log ρ_{i,t})
  (GSPO's sequence ratio).

Rollout-side: mean token entropy of the sampling distribution, mean number of segments per
response, and the mean number of distinct correct answers per group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _segment_log_means(log_ratio: Tensor, mask: Tensor, segment_ids: Tensor) -> Tensor:
    """mean log ρ over each (response, segment) that has valid tokens, flattened [S]."""
    n, t = log_ratio.shape
    width = int(segment_ids.max()) + 1 if segment_ids.numel() else 1
    key = (torch.arange(n, device=mask.device)[:, None] * width + segment_ids).flatten()
    m = mask.flatten().to(log_ratio.dtype)
    sums = torch.zeros(n * width, dtype=log_ratio.dtype).index_add_(0, key, log_ratio.flatten() * m)
    counts = torch.zeros(n * width, dtype=log_ratio.dtype).index_add_(0, key, m)
    keep = counts > 0
    return sums[keep] / counts[keep]


def ratio_diagnostics(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    segment_ids: Tensor | None = None,
    eps: float = 0.2,
) -> dict[str, float]:
    """The ratio metrics of the module doc for [N, T] log-probs under `mask` (float or bool);
    the segment clip fraction only with `segment_ids` [N, T] (long, per response from 0)."""
    if eps <= 0:
        raise ValueError(f"ratio_diagnostics: eps must be > 0, got {eps}")
    valid = mask.bool()
    if not valid.any():
        return {}
    log_ratio = (logp.detach() - old_logp.detach()).double().masked_fill(~valid, 0.0)
    ratio = log_ratio[valid].exp()
    out = {
        "mech/ratio_mean": float(ratio.mean()),
        "mech/ratio_std": float(ratio.std(unbiased=False)),
        "mech/kl_old_new": float((ratio - 1 - ratio.log()).mean()),
        "mech/clip_frac/token": float(((ratio - 1).abs() > eps).double().mean()),
    }
    lengths = valid.sum(-1)
    has = lengths > 0
    seq = (log_ratio.sum(-1)[has] / lengths[has]).exp()
    out["mech/clip_frac/sequence"] = float(((seq - 1).abs() > eps).double().mean())
    if segment_ids is not None:
        seg = _segment_log_means(log_ratio, valid, segment_ids.long()).exp()
        out["mech/clip_frac/segment"] = float(((seg - 1).abs() > eps).double().mean())
    return out


def rollout_diagnostics(
    entropy: Tensor | None,
    mask: Tensor,
    group_ids: Tensor,
    correct: Sequence[bool],
    answers: Sequence[str | None],
    segment_ids: Tensor | None = None,
) -> dict[str, float]:
    """Mean token entropy (None: the engine computed none), segments per response (with
    `segment_ids`), and distinct correct answers per group (answers that are None count by
    themselves as one answer each)."""
    valid = mask.bool()
    out: dict[str, float] = {}
    if entropy is not None and valid.any():
        out["mech/entropy"] = float(entropy.double()[valid].mean())
    if segment_ids is not None and valid.any():
        segs = segment_ids.long().masked_fill(~valid, -1).max(-1).values + 1
        out["mech/segments_per_response"] = float(segs[valid.any(-1)].double().mean())
    groups: dict[int, set[object]] = {}
    for i, g in enumerate(group_ids.tolist()):
        found = groups.setdefault(int(g), set())
        if correct[i]:
            found.add(answers[i] if answers[i] is not None else ("row", i))
    if groups:
        out["mech/distinct_correct"] = sum(len(s) for s in groups.values()) / len(groups)
    return out
