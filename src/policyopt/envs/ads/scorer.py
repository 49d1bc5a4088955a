"""The frozen LRP bound to a live `dmrl_skill` world, and the lift arithmetic of its
predictions: what the `dmrl_lrp` reward (`reward.py`) and the `dmrl_editor` environment's
replies (`episode.py`) both compute an edit's predicted long-term lift with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from policyopt.envs.ads.adsim.abtest import POPS, Experiment
from policyopt.envs.ads.lrp.features import MemoryBank, build_bank, build_samples
from policyopt.envs.ads.lrp.io import load_lrp
from policyopt.envs.ads.lrp.model import LRP
from policyopt.envs.ads.skilldoc.env import SkillEnv
from policyopt.methods.dmrl.edit_cost import EditCost


class Scorer:
    """The frozen LRP (loaded from `path`) and the edit cost bound to one environment."""

    def __init__(self, path: str, model: LRP, bank: MemoryBank, cost: EditCost) -> None:
        self.path, self.model, self.bank, self.cost = path, model, bank, cost

    def bank_now(self, env: SkillEnv) -> MemoryBank:
        """The offline bank plus the environment's deployed experiments (all labelled; the
        model's visibility mask admits only those matured before a target's start)."""
        online = build_bank(env.experiments, float(self.model.y_mean), float(self.model.y_std))
        if len(online) == 0:
            return self.bank
        return MemoryBank(
            torch.cat([self.bank.keys, online.keys]),
            torch.cat([self.bank.values, online.values]),
            torch.cat([self.bank.matured_day, online.matured_day]),
        )

    def pop_values(self, env: SkillEnv, experiments: list[Experiment]) -> np.ndarray:
        """Predicted 7-day value per user of (control, treatment) per population [E, 2, 4]."""
        s = build_samples(experiments)
        y = self.model.predict(s.x_agn, s.x_spe, s.start_day, self.bank_now(env))
        return y.view(-1, 2, POPS).numpy().astype(float)

    def arm_values(self, env: SkillEnv, experiments: list[Experiment]) -> np.ndarray:
        """Predicted 7-day value per user of (control, treatment) [E, 2]."""
        w = np.stack([e.weights() for e in experiments])  # [E, 4]
        return (self.pop_values(env, experiments) * w[:, None, :]).sum(-1)


def load_scorer(env: SkillEnv) -> Scorer:
    """The frozen LRP at the environment's `lrp_path`, with its edit cost."""
    path = env.lrp_path
    if path is None:
        raise ValueError(
            "dmrl_lrp: the dmrl_skill task has no trained LRP (task.options.lrp_path); "
            "`policyopt quickstart dmrl` trains one first"
        )
    model, bank = load_lrp(path)
    return Scorer(str(Path(path)), model, bank, EditCost(env.risk_weights, env.eta))


def lift_rewards(
    pop_values: np.ndarray, weights: np.ndarray, rows: list[int | None], penalty: float
) -> tuple[list[float | None], float, np.ndarray]:
    """(R per row, R0, lift per arm [K]) from predicted values per (arm, control/treatment,
    population) [K, 2, 4], population shares [4], and each row's arm (None: invalid edit).
    The control is one arm: its value is taken from the first experiment."""
    r0 = float(pop_values[0, 0] @ weights)
    lifts = pop_values[:, 1] @ weights / r0 - 1.0
    rewards: list[float | None] = [
        r0 * (1.0 - penalty) if k is None else r0 * (1.0 + float(lifts[k])) for k in rows
    ]
    return rewards, r0, lifts
