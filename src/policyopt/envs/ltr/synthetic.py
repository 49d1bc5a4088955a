"""`ltr_synthetic`: the embedded learning-to-rank task, with a hidden true utility.

Each query has `docs_per_query` candidates. A document has a latent vector z ~ N(μ_q, I)
(μ_q ~ N(0, 0.5² I) a per-query shift, so that absolute values say less than comparisons
within a query). Its true utility is a smooth non-linear function of z,

    u(z) = 0.8 z_0 + 0.6 z_1 + 0.5 tanh(2 z_2) · z_3 + 0.4 sin(2 z_4) + 0.3 z_5 z_6

and its graded label l ∈ {0..4} is u + ε (ε ~ N(0, noise²)) bucketed by fixed thresholds
(most documents 0, few 4). The policy sees `num_features` features: z_0..z_7 through
monotone distortions (raw; counts round(10 exp(1.5 z)); signed heavy tails
sign(z)(e^{2|z|} − 1)), plus features
that are pure noise (some heavy-tailed). Ranking by u itself is the oracle: its NDCG@k is
below 1 only because of the label noise (`oracle_ndcg`).

The data set depends on `seed` only (not on the training seed), so runs with different
training seeds see the same queries.
"""

from __future__ import annotations

import numpy as np

from policyopt.tasks.base import TASKS
from policyopt.tasks.letor import LetorQuery
from policyopt.tasks.ranking import RankingTask

LATENT = 8
THRESHOLDS = (1.0, 1.8, 2.5, 3.2)  # label = number of thresholds u + ε reaches


# Fixed directions in latent space (oblique: every coordinate matters to each).
_DIRECTIONS = np.random.default_rng(12345).normal(size=(3, LATENT)) / np.sqrt(LATENT)


def true_utility(z: np.ndarray) -> np.ndarray:
    """u = a·z + 0.5 tanh(b·z)(c·z): a dense linear part and a smooth interaction."""
    a, b, c = (z @ d for d in _DIRECTIONS)
    return 1.2 * a + 0.5 * np.tanh(b) * c


def observed_features(z: np.ndarray, num_features: int, rng: np.random.Generator) -> np.ndarray:
    """Monotone distortions of the latent coordinates, then noise features."""
    n = z.shape[0]
    cols = []
    for j in range(LATENT):
        kind = j % 3
        if kind == 0:
            cols.append(z[:, j])
        elif kind == 1:
            cols.append(np.round(np.exp(1.5 * z[:, j]) * 10))  # a count, heavy-tailed
        else:
            cols.append(np.sign(z[:, j]) * np.expm1(2 * np.abs(z[:, j])))  # signed, heavy-tailed
    while len(cols) < num_features:
        j = len(cols)
        noise = rng.normal(size=n)
        cols.append(np.round(np.exp(2 * noise) * 5) if j % 2 else noise)
    return np.stack(cols[:num_features], 1).astype(np.float32)


def make_queries(
    count: int, docs: int, num_features: int, noise: float, rng: np.random.Generator
) -> tuple[list[LetorQuery], list[np.ndarray]]:
    queries, utilities = [], []
    for q in range(count):
        z = rng.normal(size=(docs, LATENT)) + rng.normal(scale=0.5, size=LATENT)
        u = true_utility(z)
        noisy = u + rng.normal(scale=noise, size=docs)
        labels = sum((noisy >= t).astype(np.float64) for t in THRESHOLDS)
        x = observed_features(z, num_features, rng)
        queries.append(LetorQuery(f"s{q}", labels, x))
        utilities.append(u)
    return queries, utilities


@TASKS.register("ltr_synthetic")
class SyntheticLTRTask(RankingTask):
    name = "ltr_synthetic"

    def __init__(
        self,
        train_size: int = 200,
        eval_size: int = 200,
        docs_per_query: int = 40,
        num_features: int = 24,
        noise: float = 0.5,
        seed: int = 0,
        k: int = 10,
        max_train_queries: int = 0,
    ) -> None:
        if num_features < LATENT:
            raise ValueError(f"ltr_synthetic: num_features must be >= {LATENT}, got {num_features}")
        if docs_per_query < 2 or train_size < 1 or eval_size < 1:
            raise ValueError(
                "ltr_synthetic: needs >= 2 documents per query and >= 1 query per split"
            )
        rng = np.random.default_rng(seed)
        train, u_train = make_queries(train_size, docs_per_query, num_features, noise, rng)
        held_out, u_eval = make_queries(eval_size, docs_per_query, num_features, noise, rng)
        self.utilities = {"train": u_train, "eval": u_eval}
        super().__init__({"train": train, "eval": held_out}, k, max_train_queries)

    def oracle_ndcg(self, split: str = "eval", k: int = 10, limit: int = 0) -> float:
        """Mean NDCG@k of ranking each query by its true utility (first `limit` queries)."""
        n = limit or len(self.queries[split])
        return self.ranking_ndcg(split, self.utilities[split][:n], k, limit=n)
