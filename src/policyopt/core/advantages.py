"""Advantage estimators: scalar rewards of a batch of rollouts -> one advantage per rollout.

A batch holds N rollouts; `group_ids[i]` names the prompt rollout i answers (any integers,
not necessarily contiguous or sorted). For a group g with members R_1..R_G:

- `grpo` (DeepSeekMath, arXiv 2402.03300): Â_i = (R_i − mean_g R) / (std_g R + eps), std with
  Bessel's correction (as `torch.std`).
- `dr_grpo` (Dr. GRPO, arXiv 2503.20783): Â_i = R_i − mean_g R (no division by the std).
- `rloo` (RLOO, Ahmadian et al. 2024, arXiv 2402.14740): Â_i = R_i − (1/(G−1)) Σ_{j≠i} R_j.
- `reinforce_pp` (REINFORCE++, arXiv 2501.03262): batch normalisation
  Â_i = (R_i − mean_batch R) / (std_batch R + eps); with `group_baseline=True` (the
  "REINFORCE++-baseline" variant) the group mean is subtracted first and the result divided
  by its batch std.

A group of one rollout, or a group whose rewards are all equal, carries no learning signal:
its advantage is exactly 0, never NaN.

Every estimator is registered in `ADVANTAGES` with the signature
`(rewards, group_ids, **options) -> Tensor[N]`, so that method modules can add their own
(DATPO, SRPO, DRPO) and reuse the group helpers below. An estimator may also report
metrics: it then returns `(advantages, {name: float})`; `compute_advantages` returns the
advantages alone, `advantages_and_metrics` both (the trainer logs the metrics each step).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from policyopt.core.registry import Registry

AdvantageFn = Callable[..., Tensor]

# name -> estimator(rewards [N], group_ids [N], **options) -> advantages [N]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def compute_advantages(name: str, rewards: Tensor, group_ids: Tensor, **options: Any) -> Tensor:
    """Advantages [N] of the rollouts from the estimator registered as `name`.

    rewards: [N] rewards (integer or bool rewards are converted to float32).
    group_ids: [N] integer id of each rollout's prompt group.
    options: keyword options of that estimator (e.g. `eps`, `scale_by_std`); an unknown
    option is an error that lists the valid ones.
    """
    fn = ADVANTAGES.get(name)
    return estimator_with_metrics(
        f"advantage estimator {name!r}", fn, rewards, group_ids, **options
    )[0]


def estimator_with_metrics(
    what: str, fn: Callable[..., Any], rewards: Tensor, group_ids: Tensor, /, **options: Any
) -> tuple[Tensor, dict[str, float]]:
    """Advantages of an estimator already looked up (`what` names it in errors; the one call
    path, the trainer's included), and the metrics it may report by returning
    `(advantages, metrics)` ({} for most)."""
    reject_unknown_options(what, fn, options, skip=2)
    rewards, group_ids = check_rewards(rewards, group_ids)
    out = fn(rewards, group_ids, **options)
    if isinstance(out, tuple):
        advantages, metrics = out
        return advantages, dict(metrics)
    return out, {}


def reject_unknown_options(
    what: str, fn: Callable[..., Any], options: Mapping[str, Any], skip: int = 0
) -> None:
    """Raise a TypeError naming the options `fn` does not take (after its first `skip`)."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    valid = [p.name for p in params]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(
            f"{what} got unknown option(s) {', '.join(map(repr, unknown))}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )


def check_rewards(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Validate shapes and dtypes; return float rewards and the group ids."""
    if not isinstance(rewards, Tensor) or rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor [N], got {_shape(rewards)}")
    if not isinstance(group_ids, Tensor) or group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids must be a tensor of the same shape as rewards {tuple(rewards.shape)}, "
            f"got {_shape(group_ids)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must hold integers, got dtype {group_ids.dtype}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    bad = ~torch.isfinite(rewards)
    if bad.any():
        first = int(bad.nonzero()[0, 0])
        raise ValueError(f"rewards must be finite; rewards[{first}] = {rewards[first].item()}")
    return rewards, group_ids


def _shape(x: object) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__


# ----------------------------------------------------------------------------- group helpers


def consecutive_block_size(group_ids: Tensor) -> int | None:
    """G when the rollouts are B groups of G, one group after another (distinct ids, each
    block's ids equal), else None. On the Python list: for one step's N rollouts that is
    cheaper than the tensor ops that would test it (SRPO's shaper and advantage)."""
    ids = group_ids.tolist()
    if not ids:
        return None
    size = ids.count(ids[0])
    if len(ids) % size:
        return None
    heads = ids[::size]
    if len(set(heads)) != len(heads) or ids != [h for h in heads for _ in range(size)]:
        return None
    return size


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """(index [N] in 0..num_groups-1 of each rollout's group, num_groups)."""
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, int(index.max()) + 1 if index.numel() else 0


def group_sum(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Σ over each group of `values`, one entry per group [num_groups]."""
    return values.new_zeros(num_groups).index_add_(0, index, values)


def group_mean_std(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per rollout: its group's mean, Bessel std (0 for a group of one) and size, each [N]."""
    index, num_groups = group_index(group_ids)
    count = group_sum(torch.ones_like(rewards), index, num_groups)
    mean = group_sum(rewards, index, num_groups) / count
    sq_dev = (rewards - mean[index]) ** 2
    var = group_sum(sq_dev, index, num_groups) / (count - 1).clamp(min=1)
    return mean[index], var.sqrt()[index], count[index]


def group_is_constant(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Bool [N]: True where the rollout's group has a single distinct reward."""
    index, num_groups = group_index(group_ids)
    lo = rewards.new_zeros(num_groups).scatter_reduce(0, index, rewards, "amin", include_self=False)
    hi = rewards.new_zeros(num_groups).scatter_reduce(0, index, rewards, "amax", include_self=False)
    return (lo == hi)[index]


def _batch_std(x: Tensor) -> Tensor:
    """Bessel std of the whole batch; 0 for a batch of one (torch.std would give NaN)."""
    return x.std() if x.numel() > 1 else x.new_zeros(())


# ----------------------------------------------------------------------------- estimators


@ADVANTAGES.register("grpo")
def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6, scale_by_std: bool = True
) -> Tensor:
    """Â_i = (R_i − mean_g) / (std_g + eps); `scale_by_std=False` gives R_i − mean_g."""
    mean, std, _ = group_mean_std(rewards, group_ids)
    adv = rewards - mean
    if scale_by_std:
        adv = adv / (std + eps)
    # Exact zeros for constant groups: R_i − mean_g can be a rounding error (e.g. 0.1 × 3 / 3).
    return adv.masked_fill(group_is_constant(rewards, group_ids), 0.0)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Â_i = R_i − mean_g (Dr. GRPO removes the std division, a difficulty bias)."""
    return grpo_advantages(rewards, group_ids, scale_by_std=False)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Â_i = R_i − (S_g − R_i)/(G − 1), S_g the group's reward sum; 0 for a group of one."""
    index, num_groups = group_index(group_ids)
    count = group_sum(torch.ones_like(rewards), index, num_groups)[index]
    total = group_sum(rewards, index, num_groups)[index]
    loo_mean = (total - rewards) / (count - 1).clamp(min=1)
    adv = rewards - loo_mean
    return adv.masked_fill((count == 1) | group_is_constant(rewards, group_ids), 0.0)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(
    rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6, group_baseline: bool = False
) -> Tensor:
    """REINFORCE++: (R − mean_batch)/(std_batch + eps) over the whole batch (Bessel std).

    With `group_baseline=True`: x_i = R_i − mean_g, then x_i / (std_batch x + eps).
    """
    if rewards.numel() == 0:
        return rewards.clone()
    if group_baseline:
        x = grpo_advantages(rewards, group_ids, scale_by_std=False)
    else:
        # Exact zeros when every reward is equal (R − mean can be a rounding error).
        constant = rewards.max() == rewards.min()
        x = torch.where(constant, 0.0, rewards - rewards.mean())
    return x / (_batch_std(x) + eps)


# Estimators that compare the samples of one prompt with each other declare it (the config
# check refuses one sample per prompt for them): True, or a function of their options.
grpo_advantages.group_relative = True  # type: ignore[attr-defined]
dr_grpo_advantages.group_relative = True  # type: ignore[attr-defined]
rloo_advantages.group_relative = True  # type: ignore[attr-defined]
reinforce_pp_advantages.group_relative = lambda options: bool(  # type: ignore[attr-defined]
    options.get("group_baseline", False)
)


def is_group_relative(estimator: object, options: dict) -> bool:
    """Whether `estimator` with `options` compares the samples of one prompt (its declared
    `group_relative`, a bool or a function of its options; absent: no)."""
    declared = getattr(estimator, "group_relative", False)
    return bool(declared(options)) if callable(declared) else bool(declared)
