"""DocPO (arXiv 2608.00536): Step-Aware Annealing of document-parsing rewards, and the filter
of groups whose rollouts are all perfect or all zero (SPEC §5).

Step-Aware Annealing (SAA) reshapes each raw reward M ∈ [0, 1] of an element of type e as

    R = M ** γ_e(s),    γ_e(s) = γ_init + Δγ · (1 − exp(−s / τ_e))

with s the training step (γ_init = 1, Δγ = 8 as published). γ rises from 1 to γ_init + Δγ, so
early on partial credit counts in full and later only near-perfect outputs score well.

The paper adapts τ per element type from the dispersion of that type's rewards without
publishing the rule. Ours (`DispersionController`): keep the last `window` raw rewards of each
type; once it holds `min_samples`, each update compares their coefficient of variation
CV = std / mean (population std; CV = ∞ when mean = 0) with `cv_target`:

    CV < cv_target · (1 − band):  τ ← τ · exp(−rate)   rewards bunched: anneal faster, so the
                                                       power separates the near-perfect ones;
    CV > cv_target · (1 + band):  τ ← τ · exp(+rate)   rewards spread (or all zero): anneal
                                                       slower, keep partial credit;
    otherwise τ is unchanged; τ is clamped to [tau_min, tau_max]; rate = 0 keeps τ fixed.

The shaper observes the batch's raw rewards, updates each type present, then shapes the
batch with the updated τ. With dynamic sampling it is called once per sampling round: every
round's raw rewards join the window (they are all samples of the current policy, and the
all-perfect / all-zero groups a filter drops are part of the dispersion), but τ moves at
most once per training step, so every round of a step is shaped with the same γ and the
adaptation rate does not depend on how many rounds a step needed.

Composition: SAA transforms the task reward M only; additive terms (DAPO's overlong penalty,
other weighted reward functions) add after it (`policyopt.rewards.shaping`), so M stays in
[0, 1] here.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from policyopt.core.filters import GROUP_FILTERS, group_min_max
from policyopt.core.registry import unknown_name_message
from policyopt.methods.presets import register_preset
from policyopt.rewards.shaping import SHAPERS, RewardShaper, ShapingContext

GAMMA_INIT = 1.0  # SPEC §5
GAMMA_DELTA = 8.0  # SPEC §5


def step_aware_gamma(
    step: int | float, tau: float, gamma_init: float = GAMMA_INIT, delta: float = GAMMA_DELTA
) -> float:
    """γ(s) = γ_init + Δγ (1 − exp(−s/τ))."""
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"step_aware_gamma: tau must be finite and > 0, got {tau}")
    if not (math.isfinite(step) and step >= 0):
        raise ValueError(f"step_aware_gamma: step must be finite and >= 0, got {step}")
    return gamma_init + delta * (1.0 - math.exp(-step / tau))


@dataclass
class DispersionController:
    """Per-element-type τ, adapted from the rolling CV of raw rewards (rule: module docstring).

    tau_init: τ of a type when first seen (steps). tau_min, tau_max: clamp of τ.
    cv_target, band: the CV dead band is cv_target · [1 − band, 1 + band].
    rate: log-τ step per update (0 keeps τ fixed). window: raw rewards kept per type.
    min_samples: rewards a type needs before its τ moves.
    """

    tau_init: float = 100.0
    tau_min: float = 10.0
    tau_max: float = 1000.0
    cv_target: float = 0.25
    band: float = 0.2
    rate: float = 0.05
    window: int = 256
    min_samples: int = 32

    def __post_init__(self) -> None:
        if not (0 < self.tau_min <= self.tau_init <= self.tau_max < math.inf):
            raise ValueError(
                "DispersionController: need 0 < tau_min <= tau_init <= tau_max < inf, got "
                f"{self.tau_min}, {self.tau_init}, {self.tau_max}"
            )
        if not (self.cv_target > 0 and 0 <= self.band < 1 and self.rate >= 0):
            raise ValueError(
                "DispersionController: need cv_target > 0, 0 <= band < 1, rate >= 0, got "
                f"{self.cv_target}, {self.band}, {self.rate}"
            )
        if not (1 <= self.min_samples <= self.window):
            raise ValueError(
                f"DispersionController: need 1 <= min_samples <= window, got "
                f"{self.min_samples}, {self.window}"
            )
        self._tau: dict[str, float] = {}
        self._rewards: dict[str, deque[float]] = {}
        self._moved_at: dict[str, int] = {}  # the step of each type's last τ move

    def tau(self, element_type: str) -> float:
        """The type's current τ (tau_init until its first update)."""
        return float(self._tau.get(element_type, self.tau_init))

    def observe(self, element_type: str, rewards: Sequence[float]) -> None:
        """Add raw rewards of one type to its rolling window."""
        window = self._rewards.setdefault(element_type, deque(maxlen=self.window))
        window.extend(float(r) for r in rewards)

    def cv(self, element_type: str) -> float | None:
        """CV = std/mean of the type's window (∞ if mean is 0); None below min_samples."""
        window = self._rewards.get(element_type, ())
        if len(window) < self.min_samples:
            return None
        mean = sum(window) / len(window)
        if mean <= 0:
            return math.inf
        var = sum((r - mean) ** 2 for r in window) / len(window)
        return math.sqrt(var) / mean

    def update(self, element_type: str, step: int | None = None) -> float:
        """One step of the rule; returns the type's new τ. With `step`, τ moves at most once
        per step (later calls in the same step return it unchanged)."""
        if step is not None:
            if self._moved_at.get(element_type) == step:
                return self.tau(element_type)
            self._moved_at[element_type] = step
        cv = self.cv(element_type)
        tau = self.tau(element_type)
        if cv is not None and cv < self.cv_target * (1 - self.band):
            tau *= math.exp(-self.rate)
        elif cv is not None and cv > self.cv_target * (1 + self.band):
            tau *= math.exp(self.rate)
        self._tau[element_type] = float(min(self.tau_max, max(self.tau_min, tau)))
        return self._tau[element_type]

    def state_dict(self) -> dict[str, Any]:
        return {
            "tau": dict(self._tau),
            "rewards": {t: list(w) for t, w in self._rewards.items()},
            "moved_at": dict(self._moved_at),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # "moved_at" is absent from checkpoints written before τ moved once per step.
        if not {"tau", "rewards"} <= set(state) <= {"tau", "rewards", "moved_at"}:
            raise ValueError(
                "DispersionController state must have keys 'tau', 'rewards' (and "
                f"'moved_at'), got {sorted(state)}"
            )
        self._tau = {t: float(v) for t, v in state["tau"].items()}
        self._rewards = {
            t: deque((float(r) for r in w), maxlen=self.window) for t, w in state["rewards"].items()
        }
        self._moved_at = {t: int(s) for t, s in state.get("moved_at", {}).items()}


class StepAwareShaper(RewardShaper):
    """R = M ** γ_e(step) with γ_e from `step_aware_gamma` and τ_e from the controller.

    type_column: the dataset column naming each sample's element type.
    """

    def __init__(
        self,
        gamma_init: float = GAMMA_INIT,
        delta: float = GAMMA_DELTA,
        type_column: str = "element_type",
        controller: DispersionController | None = None,
    ) -> None:
        if not (
            math.isfinite(gamma_init) and gamma_init > 0 and math.isfinite(delta) and delta >= 0
        ):
            raise ValueError(
                f"StepAwareShaper: need gamma_init > 0 and delta >= 0, got {gamma_init}, {delta}"
            )
        self.gamma_init = gamma_init
        self.delta = delta
        self.type_column = type_column
        self.controller = controller if controller is not None else DispersionController()

    def __call__(
        self, rewards: torch.Tensor, ctx: ShapingContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if self.type_column not in ctx.columns:
            raise KeyError(
                f"StepAwareShaper needs a {self.type_column!r} column naming each sample's "
                f"element type; the batch has {sorted(ctx.columns)}"
            )
        return self.shape(rewards, ctx.columns[self.type_column], ctx.step)

    def shape(
        self, rewards: torch.Tensor | Sequence[float], element_types: Sequence[str], step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Shaped rewards [N] (same dtype as a tensor input) and per-type metrics."""
        m = torch.as_tensor(rewards)
        if not m.is_floating_point():
            m = m.double()
        if m.dim() != 1 or len(m) != len(element_types):
            raise ValueError(
                f"StepAwareShaper: rewards of shape {tuple(m.shape)} for {len(element_types)} "
                "element types; expected one reward per sample"
            )
        bad = torch.nonzero(~((m >= -1e-6) & (m <= 1 + 1e-6))).flatten()
        if len(bad):
            i = int(bad[0])
            raise ValueError(
                f"StepAwareShaper needs raw rewards in [0, 1]; sample {i} has {float(m[i])}"
            )
        m = m.clamp(0.0, 1.0)
        by_type: dict[str, list[int]] = {}
        for i, t in enumerate(element_types):
            by_type.setdefault(str(t), []).append(i)
        gamma = torch.empty_like(m)
        metrics: dict[str, float] = {}
        for t, index in by_type.items():
            raw = m[index]
            self.controller.observe(t, raw.tolist())
            tau = self.controller.update(t, step)
            g = step_aware_gamma(step, tau, self.gamma_init, self.delta)
            gamma[index] = g
            cv = self.controller.cv(t)
            metrics[f"docpo/{t}/gamma"] = g
            metrics[f"docpo/{t}/tau"] = tau
            metrics[f"docpo/{t}/raw_mean"] = float(raw.mean())
            metrics[f"docpo/{t}/shaped_mean"] = float((raw**g).mean())
            if cv is not None:
                metrics[f"docpo/{t}/cv"] = cv
        return m**gamma, metrics

    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.controller.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state["controller"])


_SHAPER_KEYS = ("gamma_init", "delta", "type_column")
_CONTROLLER_KEYS = tuple(f.name for f in fields(DispersionController))


@SHAPERS.register("step_aware_annealing")
def step_aware_annealing(**options: Any) -> StepAwareShaper:
    """SHAPERS factory: StepAwareShaper options (gamma_init, delta, type_column) and
    DispersionController fields (tau_init, ..., min_samples) in one flat dict."""
    for key in options:
        if key not in step_aware_annealing.option_names:
            raise ValueError(
                unknown_name_message(
                    "step_aware_annealing option", key, list(step_aware_annealing.option_names)
                )
            )
    controller = DispersionController(**{k: v for k, v in options.items() if k in _CONTROLLER_KEYS})
    return StepAwareShaper(
        **{k: v for k, v in options.items() if k in _SHAPER_KEYS}, controller=controller
    )


# What its **options takes; the config check at load reads it too (trainer.config_parts).
step_aware_annealing.option_names = _SHAPER_KEYS + _CONTROLLER_KEYS


@GROUP_FILTERS.register("docpo")
def filter_degenerate_groups(
    rewards: torch.Tensor, group_ids: torch.Tensor, low: float = 0.0, high: float = 1.0
) -> torch.Tensor:
    """Keep mask [N]: False for every sample of a group whose rewards are all >= high (all
    perfect) or all <= low (all zero): their group-relative advantages are all zero. The
    trainer applies it to the shaped task reward M^γ (SAA maps 0 to 0 and 1 to 1, so the mask
    is that of the raw M), not to additive penalties."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"filter_degenerate_groups: rewards {tuple(rewards.shape)} and group_ids "
            f"{tuple(group_ids.shape)} must be 1-D of the same length"
        )
    if not low < high:
        raise ValueError(f"filter_degenerate_groups: need low < high, got {low}, {high}")
    if len(rewards) == 0:
        return torch.zeros(0, dtype=torch.bool)
    lo, hi = group_min_max(rewards, group_ids)
    return ~((lo >= high) | (hi <= low))


# The DocPO preset (SPEC §5): GRPO advantages with the token clip, 8 rollouts per prompt, no KL;
# DocPO's reward of each row's element type, Step-Aware Annealing, and the all-perfect /
# all-zero group filter. The rewards are continuous: a rollout counts as correct (accuracy,
# pass@k during training) from 0.99. Ablation without SAA: reward.shapers=[].
register_preset(
    "docpo",
    {
        "algorithm": {
            "advantage": "grpo",
            "loss": "ppo_clip",
            "agg": "seq-mean-token-mean",
            "kl_coef": 0.0,
            "group_filter": "docpo",
        },
        "rollout": {"group_size": 8},
        "reward": {
            "functions": [{"name": "docparse"}],
            "shapers": [{"name": "step_aware_annealing"}],
            "correct_threshold": 0.99,
        },
    },
)
