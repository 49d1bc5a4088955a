"""The surrogate-index baseline (Athey et al. 2019): a linear regression of an experiment's
7-day effect on its day-1 treatment − control differences of the aggregate signals."""

from __future__ import annotations

import numpy as np

from policyopt.envs.ads.adsim.abtest import Experiment


def day1_deltas(experiments: list[Experiment]) -> np.ndarray:
    """[E, 5] treatment − control per-user means of the day-1 signals."""
    return np.array([e.arms[1].aggregate() - e.arms[0].aggregate() for e in experiments])


class SurrogateIndex:
    def __init__(self, ridge: float = 1e-6) -> None:
        self.ridge = ridge
        self.coef: np.ndarray | None = None

    def fit(self, experiments: list[Experiment]) -> SurrogateIndex:
        x = np.hstack([day1_deltas(experiments), np.ones((len(experiments), 1))])
        y = np.array([e.effect for e in experiments])
        self.coef = np.linalg.solve(x.T @ x + self.ridge * np.eye(x.shape[1]), x.T @ y)
        return self

    def predict(self, experiments: list[Experiment]) -> np.ndarray:
        if self.coef is None:
            raise RuntimeError("SurrogateIndex.predict before fit")
        x = np.hstack([day1_deltas(experiments), np.ones((len(experiments), 1))])
        return x @ self.coef
