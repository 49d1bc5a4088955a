"""SRPO's structure-normalised advantage (arXiv 2607.25268; SPEC §6).

For rollouts i, j of one group g of G, rewards R and distances D_ij between their rankings:

    D'_ij = D_ij / c_g                           the distance's scale (`normalize`)
    S_ij  = (R_i − R_j) / (D'_ij + eps)          reward gained per unit of ranking change
    A_i   = 1/(G − 1) · Σ_{j≠i, j ∈ g} tanh(S_ij / (τ σ_g))

σ_g the group's reward std with Bessel's correction (as `grpo`'s), τ the `temperature`.
How D is scaled is unpublished (SPEC §6), so c_g is an option:

- `normalize="reverse"`: c_g = d(σ, reverse σ), the largest distance a ranking of the
  group's n items can have (the `distance_scale` the `ranking_distances` shaper produces), so
  D' ∈ [0, 1]. With ΔR/σ ≈ 1 most pairs saturate (|S/σ| > 2) once the policy sharpens and
  D' shrinks: A_i is then a plain win rate.
- `normalize="group_mean"`: c_g = the mean of D over the group's pairs i ≠ j, so D' is 1
  for a typical pair at any stage of training (scale-free: the same for raw or normalised D).
- `normalize="none"`: c_g = 1 (D as given).

D = 0 with unequal rewards (two rollouts whose rankings are the same, e.g. LM completions
that parse to the same list, or one ranking scored twice by a noisy click model): the pair
says nothing about which ranking change pays, so its term is 0 (it still counts in the
1/(G − 1) mean). Without the rule S = ΔR/eps and tanh = ±1, the largest possible weight for
a difference the ranking did not cause. For a ranking policy the two rollouts have the same
log-prob gradient, so their ±1 terms cancel in the update anyway; the rule removes them
from the advantages too.

A constant group, or a group of one, carries no signal: A = 0 exactly. Only entries of D
within a group are read. D is declared structure (`needs("distances")`), made by the
`ranking_distances` shaper, with `distance_scale` (optional: needed for "reverse" only).

Metrics, every call: `srpo/saturation`, the share of pairs (i ≠ j in a group with unequal
rewards, D > 0) whose tanh argument has |S/(τσ)| > 2 (tanh > 0.96: the term is a sign);
`srpo/corr_grpo`, the Pearson correlation over the rollouts of such groups between A and
GRPO's (R − mean_g)/std_g; `srpo/zero_distance_pairs`, the share of those pairs with D = 0.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from policyopt.core.advantages import ADVANTAGES, consecutive_block_size
from policyopt.core.structure import needs

NORMALIZATIONS = ("reverse", "group_mean", "none")
METRICS = ("srpo/saturation", "srpo/zero_distance_pairs", "srpo/corr_grpo")
SATURATED = 2.0  # |tanh argument| above which a term is counted as saturated


@ADVANTAGES.register("srpo")
@needs("distances", optional=("distance_scale",))
def srpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    distances: Tensor,
    distance_scale: Tensor | None = None,
    normalize: str = "reverse",
    temperature: float = 1.0,
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """A_i = mean over the other members j of tanh(((R_i − R_j)/(D'_ij + eps)) / (τ σ_g)),
    with the metrics of the module docstring."""
    n = rewards.shape[0]
    if not isinstance(distances, Tensor) or distances.shape != (n, n):
        shape = tuple(distances.shape) if isinstance(distances, Tensor) else type(distances)
        raise ValueError(f"srpo: distances must be [N, N] = [{n}, {n}], got {shape}")
    if eps <= 0:
        raise ValueError(f"srpo: eps must be > 0, got {eps}")
    if temperature <= 0:
        raise ValueError(f"srpo: temperature must be > 0, got {temperature}")
    if normalize not in NORMALIZATIONS:
        raise ValueError(
            f"srpo: unknown normalize {normalize!r}; valid: {', '.join(NORMALIZATIONS)}"
        )
    size = consecutive_block_size(group_ids)
    if size is not None:  # the usual batch: G rollouts per prompt, one group after another
        return _block_advantages(
            rewards, size, distances, distance_scale, normalize, temperature, eps
        )
    return _general_advantages(
        rewards, group_ids, distances, distance_scale, normalize, temperature, eps
    )


def _block_advantages(
    rewards: Tensor,
    size: int,
    distances: Tensor,
    distance_scale: Tensor | None,
    normalize: str,
    temperature: float,
    eps: float,
) -> tuple[Tensor, dict[str, float]]:
    """The advantage of B consecutive groups of G, on their [B, G, G] diagonal blocks of D
    (the same formula as `_general_advantages`, on G² instead of N² entries per group)."""
    n = rewards.shape[0]
    b = n // size
    r = rewards.view(b, size)
    scale = _checked_scale(distance_scale, n, rewards.dtype) if normalize == "reverse" else None
    if size < 2:  # groups of one: no signal, no pairs
        return torch.zeros_like(rewards), dict.fromkeys(METRICS, 0.0)
    std, mean = torch.std_mean(r, dim=1, keepdim=True)  # [B, 1], σ with Bessel's correction
    dead = (r == r[:, :1]).all(1, keepdim=True)  # [B, 1]: a constant group
    # Block g of D is D[gG:(g+1)G, gG:(g+1)G]: a strided view, copied once by the mask.
    blocks = distances.view(b, size, b, size).diagonal(0, 0, 2).permute(2, 0, 1)
    d = blocks.to(rewards.dtype).masked_fill(_eye(size), 0.0)
    low, high = torch.aminmax(d)
    if not (bool(low >= 0) and bool(high < torch.inf)):  # NaN fails both
        raise ValueError("srpo: distances within a group must be finite and >= 0")
    if normalize == "group_mean":
        total = d.sum((1, 2), keepdim=True) / (size * (size - 1))
        d = d / torch.where(total > 0, total, torch.ones_like(total))
    elif normalize == "reverse":
        d = d / scale.view(b, size, 1)
    diff = r[:, :, None] - r[:, None, :]  # R_i − R_j
    live = d > 0  # the diagonal is 0; D = 0: the same ranking, the term is 0 (docstring)
    tiny = torch.finfo(rewards.dtype).tiny
    arg = diff / (d + eps) / (temperature * std.clamp(min=tiny))[:, :, None]
    terms = torch.tanh(arg) * live
    adv = (terms.sum(2) / (size - 1)).masked_fill(dead, 0.0)
    grpo = ((r - mean) / (std + 1e-6)).masked_fill(dead, 0.0)
    return adv.view(n), _block_metrics(adv, grpo, arg, live & ~dead[:, :, None], dead)


@functools.lru_cache(maxsize=16)
def _eye(size: int) -> Tensor:
    """The diagonal mask of a G × G block (shared: not to be modified)."""
    return torch.eye(size, dtype=torch.bool)


def _block_metrics(
    adv: Tensor, grpo: Tensor, arg: Tensor, counted: Tensor, dead: Tensor
) -> dict[str, float]:
    """`_metrics` of the block layout: adv, grpo [B, G]; arg, counted [B, G, G]; dead
    [B, 1]. The pairs are the ordered i ≠ j of the groups that are not constant."""
    b, size = adv.shape
    saturated = (arg.abs() > SATURATED).logical_and_(counted)
    n_counted, n_saturated, n_dead = torch.stack(
        [counted.sum(), saturated.sum(), dead.sum()]
    ).tolist()
    n_pairs = (b - n_dead) * size * (size - 1)
    if n_dead:  # the correlation is over the groups with signal
        rows = ~dead.squeeze(1)
        adv, grpo = adv[rows], grpo[rows]
    return {
        "srpo/saturation": n_saturated / n_counted if n_counted else 0.0,
        "srpo/zero_distance_pairs": (n_pairs - n_counted) / n_pairs if n_pairs else 0.0,
        "srpo/corr_grpo": _pearson(adv.flatten(), grpo.flatten()),
    }


def _general_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    distances: Tensor,
    distance_scale: Tensor | None,
    normalize: str,
    temperature: float,
    eps: float,
) -> tuple[Tensor, dict[str, float]]:
    """Any grouping, from the [N, N] same-group mask."""
    n = rewards.shape[0]
    member = group_ids[:, None] == group_ids[None, :]
    m = member.to(rewards.dtype)
    count = m.sum(1)
    others = (count - 1).clamp(min=1)
    mean = (m @ rewards) / count
    dev = rewards[None, :] - mean[:, None]  # R_j − mean_g(i)
    std = ((m * dev.square()).sum(1) / others).sqrt()
    # A constant group, or a group of one: no member's reward differs from row i's.
    dead = ~(member & (rewards[None, :] != rewards[:, None])).any(1)
    same = member.clone()
    same.fill_diagonal_(False)
    d = distances.to(rewards.dtype).masked_fill(~same, 0.0)
    low, high = torch.aminmax(d) if n else (d.new_zeros(()), d.new_zeros(()))
    if not (bool(low >= 0) and bool(high < torch.inf)):  # 0 outside groups; NaN fails both
        raise ValueError("srpo: distances within a group must be finite and >= 0")
    d = d / _scale(d, same, m, distance_scale, normalize)[:, None]
    diff = rewards[:, None] - rewards[None, :]  # R_i − R_j
    live = same & (d > 0)  # D = 0: the same ranking, the pair's term is 0 (docstring)
    tiny = torch.finfo(rewards.dtype).tiny
    arg = diff / (d + eps) / (temperature * std.clamp(min=tiny))[:, None]
    terms = torch.tanh(arg) * live
    adv = (terms.sum(1) / others).masked_fill(dead, 0.0)
    pairs = same & ~dead[:, None]
    grpo = ((rewards - mean) / (std + 1e-6)).masked_fill(dead, 0.0)
    return adv, _metrics(adv, grpo, arg, pairs, live)


def _scale(d: Tensor, same: Tensor, member: Tensor, scale: Tensor | None, normalize: str) -> Tensor:
    """c_g per rollout [N] (1 where it would be 0: a group whose rankings are all equal)."""
    if normalize == "none":
        return torch.ones(d.shape[0], dtype=d.dtype)
    if normalize == "reverse":
        return _checked_scale(scale, d.shape[0], d.dtype)
    # The group's mean over its ordered pairs i ≠ j: Σ_{rows of the group} Σ_j D / Σ pairs.
    total = member @ d.sum(1)
    npairs = member @ same.sum(1).to(d.dtype)
    mean = total / npairs.clamp(min=1)
    return torch.where(mean > 0, mean, torch.ones_like(mean))


def _checked_scale(scale: Tensor | None, n: int, dtype: torch.dtype) -> Tensor:
    """c_g per rollout [N] for normalize="reverse": the shaper's `distance_scale`."""
    if scale is None:
        raise ValueError(
            "srpo: normalize='reverse' needs distance_scale (d(σ, reverse σ) per rollout, "
            "produced by the ranking_distances shaper); with distances that are already "
            "normalised, use normalize='none'"
        )
    if scale.shape != (n,) or (scale <= 0).any():
        raise ValueError(f"srpo: distance_scale must be [N] and > 0, got {tuple(scale.shape)}")
    return scale.to(dtype)


def _metrics(adv: Tensor, grpo: Tensor, arg: Tensor, pairs: Tensor, live: Tensor) -> dict:
    counted = pairs & live
    saturated = (arg.abs() > SATURATED).logical_and_(counted)
    n_pairs, n_counted, saturated = torch.stack([pairs, counted, saturated]).sum((1, 2)).tolist()
    rows = pairs.any(1).nonzero().squeeze(1)
    return {
        "srpo/saturation": saturated / n_counted if n_counted else 0.0,
        "srpo/zero_distance_pairs": (n_pairs - n_counted) / n_pairs if n_pairs else 0.0,
        "srpo/corr_grpo": _pearson(adv[rows], grpo[rows]),
    }


def _pearson(x: Tensor, y: Tensor) -> float:
    """Pearson correlation; 0 when either side has no spread (or fewer than 2 values).
    The centred 2 × 2 Gram matrix gives Σxx, Σyy and Σxy in one product (float64)."""
    if x.numel() < 2:
        return 0.0
    v = torch.stack([x, y]).double()
    v = v - v.mean(1, keepdim=True)
    (sxx, sxy), (_, syy) = (v @ v.t()).tolist()
    denom = math.sqrt(sxx * syy)
    return sxy / denom if denom > 0 else 0.0
