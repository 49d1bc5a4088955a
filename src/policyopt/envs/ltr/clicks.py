"""`ltr_clicks`: learning to rank from simulated clicks (limited, noisy, position-biased feedback).

The queries are `ltr_synthetic`'s (latent documents, hidden true utility, graded labels
l ∈ {0..4}), with many candidates per query (150 by default). The training reward of a
ranking is not its NDCG but the number of clicks a simulated user gives its top k, under the
position-based click model (PBM; Richardson et al. 2007, Joachims et al. 2017, the
simulation of Oosterhuis & de Rijke 2018):

    P(click on the document at rank r) = θ_r · ε(l),       r = 1..k
    θ_r  = (1 / r)^η                                         examination (position bias)
    ε(l) = ε₋ + (ε₊ − ε₋) · (2^l − 1) / (2^4 − 1)            attraction (noise: ε₋ > 0)

clicks independent given the ranking; reward = Σ_{r ≤ k} click_r (0..k). Defaults η = 1,
ε₋ = 0.1 (a non-relevant document is clicked 10% of the times it is examined), ε₊ = 1.
The policy never sees a label: one ranking, one draw of clicks. Held-out evaluation is NDCG@k
of the greedy ranking on the true labels (as `ltr_synthetic`). Expected clicks are monotone
in the labels placed higher, so a policy that maximises them also ranks by relevance.

The clicks are drawn from the task's own generator (`click_seed`), in the order the rewards
are computed, so a run is reproducible.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policyopt.envs.ltr.synthetic import SyntheticLTRTask
from policyopt.rewards.ranked_text import parse_ranking
from policyopt.tasks.base import TASKS

MAX_LABEL = 4


def click_probabilities(
    labels: np.ndarray, eta: float = 1.0, eps_minus: float = 0.1, eps_plus: float = 1.0
) -> np.ndarray:
    """P(click) at ranks 1..len(labels) of documents with these labels, in rank order."""
    ranks = np.arange(1, len(labels) + 1, dtype=np.float64)
    theta = (1.0 / ranks) ** eta
    attract = eps_minus + (eps_plus - eps_minus) * (2.0 ** np.asarray(labels) - 1) / (
        2.0**MAX_LABEL - 1
    )
    return theta * attract


@TASKS.register("ltr_clicks")
class ClickLTRTask(SyntheticLTRTask):
    """ltr_synthetic queries, reward = clicks of a position-based click model on the top k."""

    name = "ltr_clicks"

    def __init__(
        self,
        train_size: int = 200,
        eval_size: int = 200,
        docs_per_query: int = 150,
        num_features: int = 24,
        noise: float = 0.5,
        seed: int = 0,
        k: int = 10,
        max_train_queries: int = 0,
        eta: float = 1.0,
        eps_minus: float = 0.1,
        eps_plus: float = 1.0,
        click_seed: int = 0,
    ) -> None:
        if eta < 0 or not 0 <= eps_minus <= eps_plus <= 1:
            raise ValueError(
                "ltr_clicks: needs eta >= 0 and 0 <= eps_minus <= eps_plus <= 1, got "
                f"eta={eta}, eps_minus={eps_minus}, eps_plus={eps_plus}"
            )
        super().__init__(
            train_size, eval_size, docs_per_query, num_features, noise, seed, k, max_train_queries
        )
        self.eta, self.eps_minus, self.eps_plus = eta, eps_minus, eps_plus
        self.rng = np.random.default_rng(click_seed)

    def expected_clicks(self, ranking: list[int], labels: list[float]) -> float:
        """E[clicks on the top k] of a ranking (candidate indices) under the click model."""
        top = np.asarray(labels, dtype=np.float64)[ranking[: self.k]]
        return float(click_probabilities(top, self.eta, self.eps_minus, self.eps_plus).sum())

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        """One draw of the clicks on the completion's top k (None: unparseable)."""
        labels = row["labels"]
        ranking = parse_ranking(completion, len(labels), row.get("items"))
        if ranking is None:
            return None
        top = np.asarray(labels, dtype=np.float64)[ranking[: self.k]]
        p = click_probabilities(top, self.eta, self.eps_minus, self.eps_plus)
        return float((self.rng.random(len(p)) < p).sum())
