"""LRP inputs from A/B experiments: one sample per (experiment, arm, population).

For arm a (0 control, 1 treatment) and population p of an experiment:

    s      log(1 + day-1 signals per user) of (a, p)           [5]
    s0     the same for the control arm                        [5]
    ds     s − s0                                              [5]
    dtraj  within-day shape minus the control's: each slot's share of the day's total for
           (items, clicks, revenue), treatment − control       [12]
    theta  the arm's parameters scaled to [0, 1]               [P = 14]
    dtheta theta − control's theta (0 for the control arm)     [P]

x_agn = [s, s0, ds, dtraj, theta, dtheta] (27 + 2P = 55) is what the population-agnostic
encoder sees; the population-specific encoder also sees [one-hot p, share of p] (5).
Memory-bank entries come from matured experiments, one per (experiment, population):
key = [ds, dtheta, one-hot p, s0] (14 + P = 28) and value = [dtraj, true 7-day effect of p,
control's 7-day value of p] (14), both from the treatment arm; labels in the model's scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from policyopt.envs.ads.adsim.abtest import POPS, Experiment
from policyopt.envs.ads.adsim.params import NAMES

P = len(NAMES)  # whitelisted parameters
AGN_DIM = 27 + 2 * P
SPE_EXTRA = 5
KEY_DIM = 14 + P
VALUE_DIM = 14


def _shape(traj: np.ndarray) -> np.ndarray:
    """Each slot's share of the day's total [T, 3] -> flat [3T]."""
    return (traj / np.maximum(traj.sum(0, keepdims=True), 1e-9)).reshape(-1)


@dataclass
class Samples:
    """Rows for the LRP: one per (experiment, arm, population), experiments in order."""

    x_agn: Tensor  # [S, AGN_DIM]
    x_spe: Tensor  # [S, 5]
    pop: Tensor  # [S] long
    arm: Tensor  # [S] long
    experiment: Tensor  # [S] long, index into the experiment list
    start_day: Tensor  # [S] long
    weight: Tensor  # [S] the population's share of the experiment's users
    y: Tensor  # [S] true 7-day value per user (nan when unknown)


def experiment_rows(e: Experiment) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x_agn [2·4, AGN_DIM], x_spe [2·4, 5], y [2·4]) for arms × populations, arm-major."""
    theta0 = e.control.vector()
    agn, spe, ys = [], [], []
    for a, arm in enumerate(e.arms):
        theta = (e.treatment if a else e.control).vector()
        for p in range(POPS):
            s = np.log1p(arm.pop_signals[p])
            s0 = np.log1p(e.arms[0].pop_signals[p])
            dtraj = _shape(arm.pop_trajectory[p]) - _shape(e.arms[0].pop_trajectory[p])
            agn.append(np.concatenate([s, s0, s - s0, dtraj, theta, theta - theta0]))
            onehot = np.eye(POPS)[p]
            spe.append(np.concatenate([onehot, [e.shares[p]]]))
            ys.append(np.nan if e.pop_values is None else e.pop_values[a, p])
    return np.array(agn), np.array(spe), np.array(ys)


def build_samples(experiments: list[Experiment]) -> Samples:
    agn, spe, ys, pop, arm, exp, day, w = [], [], [], [], [], [], [], []
    for k, e in enumerate(experiments):
        a, s, y = experiment_rows(e)
        agn.append(a)
        spe.append(s)
        ys.append(y)
        shares = e.weights()
        for ai in range(2):
            for p in range(POPS):
                pop.append(p)
                arm.append(ai)
                exp.append(k)
                day.append(e.start_day)
                w.append(shares[p])
    f = torch.float32
    return Samples(
        x_agn=torch.tensor(np.concatenate(agn), dtype=f),
        x_spe=torch.tensor(np.concatenate(spe), dtype=f),
        pop=torch.tensor(pop),
        arm=torch.tensor(arm),
        experiment=torch.tensor(exp),
        start_day=torch.tensor(day),
        weight=torch.tensor(w, dtype=f),
        y=torch.tensor(np.concatenate(ys), dtype=f),
    )


@dataclass
class MemoryBank:
    """Matured past experiments, one entry per (experiment, population)."""

    keys: Tensor  # [M, KEY_DIM]
    values: Tensor  # [M, 14]
    matured_day: Tensor  # [M] long: start_day + 7

    def __len__(self) -> int:
        return len(self.matured_day)

    @staticmethod
    def empty() -> MemoryBank:
        return MemoryBank(torch.zeros(0, KEY_DIM), torch.zeros(0, VALUE_DIM), torch.zeros(0).long())

    def visible(self, start_day: Tensor) -> Tensor:
        """Bool [S, M]: entry m may inform a target that started on start_day[s] only if it
        had matured by then (matured_day ≤ start_day): no label from the future leaks in."""
        return self.matured_day[None, :] <= start_day[:, None]


def build_bank(experiments: list[Experiment], y_mean: float, y_std: float) -> MemoryBank:
    """Bank entries of experiments with true labels (`pop_values`); labels standardised."""
    keys, values, days = [], [], []
    for e in experiments:
        if e.pop_values is None:
            continue
        a, _, _ = experiment_rows(e)
        for p in range(POPS):
            row = a[POPS + p]  # treatment arm, population p
            ds, dtraj, dtheta, s0 = row[10:15], row[15:27], row[27 + P :], row[5:10]
            effect = (e.pop_values[1, p] - e.pop_values[0, p]) / y_std
            control = (e.pop_values[0, p] - y_mean) / y_std
            keys.append(np.concatenate([ds, dtheta, np.eye(POPS)[p], s0]))
            values.append(np.concatenate([dtraj, [effect, control]]))
            days.append(e.matured_day)
    if not keys:
        return MemoryBank.empty()
    f = torch.float32
    return MemoryBank(
        torch.tensor(np.array(keys), dtype=f),
        torch.tensor(np.array(values), dtype=f),
        torch.tensor(days),
    )
