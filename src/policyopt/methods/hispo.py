"""HISPO (arXiv 2609.15471): entropy segments built at rollout time, and the preset.

Segments (SPEC section 2, steps 2-5) come from the behaviour policy's token entropies H,
once per rollout batch, and stay fixed during the update. The loss (steps 6-9) is
`policyopt.core.segment_loss` ("hispo" in `POLICY_LOSSES`).

Index conventions. The SPEC numbers a response's tokens t = 1..T (1-based); the code uses
0-based positions j = t − 1 over the response's valid tokens in order (the positions where
`mask` is 1; with right padding these are 0..T−1). In 0-based terms:

    H̃_0 = H_0;  H̃_j = α H_j + (1−α) H̃_{j−1}                       forward EMA
    τ = quantile_q({H̃_j : 1 ≤ j ≤ T−2})                              linear interpolation
                                                                     (torch.quantile's)
    candidate j: 1 ≤ j ≤ T−2, H̃_j ≥ τ, H̃_j ≥ H̃_{j−1}, H̃_j > H̃_{j+1}
    NMS: keep candidate j iff H̃_j = max{H̃_u : |u − j| ≤ ⌊Δ/2⌋, 0 ≤ u ≤ T−1} (its centred
         window, clipped to the response, endpoints included) and, scanning left to right,
         j − k ≥ Δ for the last kept boundary k (consecutive boundaries are ≥ Δ apart).

A boundary at j means token j starts a new segment: segment ids are the number of kept
boundaries at or before each token (0 for the first segment, non-decreasing). A response
with T < 3 tokens has no candidates: one segment.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from policyopt.core.structure import produces
from policyopt.methods.presets import register_preset
from policyopt.rollout.base import Rollouts, require_entropies
from policyopt.rollout.strategies import ROLLOUT_ANNOTATORS

# EMA positions computed together as one matrix product (the recurrence runs across blocks).
EMA_BLOCK = 64


def ema_forward(x: Tensor, alpha: float) -> Tensor:
    """H̃ with H̃_0 = x_0, H̃_j = α x_j + (1−α) H̃_{j−1} along the last dim of `x` [N, T]."""
    n, t = x.shape
    b = min(EMA_BLOCK, max(t, 1))
    k = torch.arange(b, dtype=x.dtype, device=x.device)
    lag = k[:, None] - k[None, :]  # j − s
    # L[j, s] = α (1−α)^(j−s) for s ≤ j; decay[j] = (1−α)^(j+1)
    lower = torch.where(lag >= 0, alpha * (1.0 - alpha) ** lag.clamp(min=0), 0.0)
    decay = (1.0 - alpha) ** (k + 1)
    out = torch.empty_like(x)
    prev = x[:, 0] if t else x.new_zeros(n)  # H̃_{−1} := x_0 makes H̃_0 = x_0
    for start in range(0, t, b):
        chunk = x[:, start : start + b]
        m = chunk.shape[1]
        out[:, start : start + m] = chunk @ lower[:m, :m].T + prev[:, None] * decay[:m]
        prev = out[:, start + m - 1]
    return out


def row_quantile(values: Tensor, valid: Tensor, q: float) -> Tensor:
    """Per-row q-quantile of `values` [N, T] over `valid` (linear interpolation, as
    torch.quantile); +inf for a row without valid entries."""
    count = valid.sum(-1)  # n
    ordered = values.masked_fill(~valid, float("inf")).sort(-1).values
    h = q * (count - 1).clamp(min=0).to(values.dtype)  # fractional rank q (n − 1)
    lo = h.floor().long()
    hi = h.ceil().long()
    v_lo = ordered.gather(-1, lo[:, None])[:, 0]
    v_hi = ordered.gather(-1, hi[:, None])[:, 0]
    tau = v_lo + (h - lo.to(values.dtype)) * (v_hi - v_lo)
    return torch.where(count > 0, tau, float("inf"))


def build_segments(
    entropies: Tensor,
    mask: Tensor,
    alpha: float = 0.1,
    quantile: float = 0.6,
    window: int = 64,
) -> Tensor:
    """Segment index [N, T] (long) of every token, from token entropies H [N, T].

    alpha: EMA weight α; quantile: q_H of the cutoff τ; window: NMS window Δ (tokens).
    Valid tokens are those of `mask` in order (any layout); padding gets the running
    segment index. See the module docstring for the exact rules and index conventions.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"build_segments: alpha must be in (0, 1], got {alpha}")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"build_segments: quantile must be in [0, 1], got {quantile}")
    if window < 1:
        raise ValueError(f"build_segments: window must be >= 1, got {window}")
    if entropies.dim() != 2 or entropies.shape != mask.shape:
        raise ValueError(
            f"build_segments: entropies and mask must be [N, T] of one shape, got "
            f"{tuple(entropies.shape)} and {tuple(mask.shape)}"
        )
    valid = mask.bool()
    n, t = valid.shape
    if t == 0:
        return torch.zeros(n, 0, dtype=torch.long, device=mask.device)
    # Pack each row's valid tokens to the left: packed position p is the p-th valid token.
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    length = valid.sum(-1)  # T_i
    h = torch.zeros(n, t, dtype=torch.float64, device=mask.device)
    h = h.scatter(1, torch.where(valid, pos, t - 1), torch.where(valid, entropies.double(), 0.0))
    j = torch.arange(t, device=mask.device)
    in_resp = j[None, :] < length[:, None]
    h = torch.where(in_resp, h, 0.0)  # (an all-padding last column was scattered into)

    smooth = ema_forward(h, alpha)  # H̃
    inner = (j[None, :] >= 1) & (j[None, :] <= length[:, None] - 2)  # 1 ≤ j ≤ T−2
    tau = row_quantile(smooth, inner, quantile)
    left = F.pad(smooth, (1, 0))[:, :-1]  # H̃_{j−1}
    right = F.pad(smooth, (0, 1))[:, 1:]  # H̃_{j+1}
    cand = inner & (smooth >= tau[:, None]) & (smooth >= left) & (smooth > right)

    half = window // 2
    masked = smooth.masked_fill(~in_resp, float("-inf"))
    local_max = F.max_pool1d(masked[:, None], 2 * half + 1, stride=1, padding=half)[:, 0]
    cand &= smooth >= local_max

    boundary = torch.zeros(n, t, dtype=torch.bool, device=mask.device)
    rows, cols = cand.nonzero(as_tuple=True)
    kept: list[tuple[int, int]] = []
    last: dict[int, int] = {}
    for i, c in zip(rows.tolist(), cols.tolist(), strict=True):  # row-major: left to right
        if c - last.get(i, -window) >= window:
            kept.append((i, c))
            last[i] = c
    if kept:
        boundary[tuple(torch.tensor(kept, device=mask.device).T)] = True
    # Back to the original layout: token at position u is packed position pos[u].
    start = boundary.gather(1, pos) & valid
    return start.long().cumsum(-1)


@ROLLOUT_ANNOTATORS.register("hispo_segments")
@produces("segment_ids")
def hispo_segments(
    rollouts: Rollouts, alpha: float = 0.1, quantile: float = 0.6, window: int = 64
) -> dict[str, Tensor]:
    """{"segment_ids": [N, R]} from the rollout-time entropies (SPEC section 2, steps 1-5)."""
    require_entropies(rollouts, "the hispo_segments annotator")
    ids = build_segments(
        rollouts.entropies, rollouts.response_mask, alpha=alpha, quantile=quantile, window=window
    )
    return {"segment_ids": ids}


def segments_per_response(
    rollouts: Rollouts, alpha: float = 0.1, quantile: float = 0.6, window: int = 64
) -> list[int]:
    """The number of HISPO segments of each response (0 for an empty one)."""
    ids = build_segments(
        rollouts.entropies, rollouts.response_mask, alpha=alpha, quantile=quantile, window=window
    )
    n_tokens = rollouts.lengths.tolist()
    return [int(ids[i, : max(n, 1)].max()) + 1 if n else 0 for i, n in enumerate(n_tokens)]


# What held-out evaluation reports of the greedy responses for this annotator (with the
# run's options, else the paper's): `eval/segments_per_response_median`.
hispo_segments.eval_summary = ("segments_per_response", segments_per_response)


# HISPO: GRPO advantages, the segment loss, entropy segments with the paper's α = 0.1,
# q_H = 0.6, Δ = 64 and L_min = 16 (the loss's default). The paper does not state the clip
# range ε: the loss's default is GRPO's 0.2 / 0.2 (SPEC section 2). The segment loss has
# its own normalisation (mean over responses), so it takes no `agg`.
register_preset(
    "hispo",
    {
        "algorithm": {"advantage": "grpo", "loss": "hispo"},
        "rollout": {"annotators": [{"name": "hispo_segments", "options": {}}]},
    },
)
