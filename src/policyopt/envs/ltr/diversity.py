"""`ltr_diversity`: intent-aware diversity, α-NDCG@k over subtopics (Clarke et al. 2008).

A query has S subtopics (intents). Document d is relevant to subtopic s (J(d, s) ∈ {0, 1})
when a latent projection crosses a threshold: z ~ N(μ_q, I) as in `ltr_synthetic`,
J(d, s) = 1[z·v_s + noise > t_s] with fixed directions v_s. Subtopic 0 is common (t_0 = 0.3:
about a third of the documents), the others rare (t_s = 1.6). The graded label used by
NDCG, LambdaRank and the listwise softmax is the number of subtopics a document covers,
min(Σ_s J(d, s), 4): the per-item relevance a scorer trained on labels sees.

The reward is α-NDCG@k of the ranking (α = 0.5):

    gain(r) = Σ_s J(d_r, s) · (1 − α)^{c_s(r)},   c_s(r) = #{r' < r : J(d_{r'}, s) = 1}
    α-DCG@k = Σ_{r ≤ k} gain(r) / log2(1 + r),    α-NDCG@k = α-DCG@k / α-DCG@k(ideal)

the ideal list built greedily (at each rank the document of largest gain given those above:
the usual approximation, as in the TREC diversity track's `ndeval`; the exact ideal is
NP-hard). A relevant document of an intent already covered gains half as much each time, so
the best list covers the rare intents early, which a ranking by the number of subtopics
(dominated by the many common-intent documents) does not. A per-item scorer can still do
better than the label order by learning to score rare-intent documents above common ones:
that is what the α-NDCG reward, and no per-item label, teaches. Evaluation reports
`eval/alpha_ndcg@10` besides NDCG@1/5/10 of the labels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policyopt.envs.ltr.synthetic import LATENT, observed_features
from policyopt.rewards.ranked_text import parse_ranking
from policyopt.tasks.base import TASKS
from policyopt.tasks.letor import LetorQuery
from policyopt.tasks.ranking import RankingTask

_SUBTOPIC_DIRECTIONS = np.random.default_rng(2008).normal(size=(8, LATENT)) / np.sqrt(LATENT)


def alpha_dcg(subtopics: np.ndarray, ranking: list[int], k: int, alpha: float) -> float:
    """α-DCG@k of a ranking (candidate indices) given J [docs, S] (0/1)."""
    seen = np.zeros(subtopics.shape[1])
    total = 0.0
    for r, d in enumerate(ranking[:k], start=1):
        gain = float((subtopics[d] * (1 - alpha) ** seen).sum())
        total += gain / np.log2(1 + r)
        seen += subtopics[d]
    return total


def ideal_alpha_dcg(subtopics: np.ndarray, k: int, alpha: float) -> float:
    """α-DCG@k of the greedy ideal list (largest gain at each rank; ties: lowest index)."""
    seen = np.zeros(subtopics.shape[1])
    left = list(range(subtopics.shape[0]))
    total = 0.0
    for r in range(1, min(k, len(left)) + 1):
        gains = (subtopics[left] * (1 - alpha) ** seen).sum(1)
        best = int(np.argmax(gains))
        total += float(gains[best]) / np.log2(1 + r)
        seen += subtopics[left[best]]
        left.pop(best)
    return total


def alpha_ndcg(subtopics: np.ndarray, ranking: list[int], k: int, alpha: float = 0.5) -> float:
    """α-NDCG@k; 0 for a query with no relevant document."""
    ideal = ideal_alpha_dcg(subtopics, k, alpha)
    return alpha_dcg(subtopics, ranking, k, alpha) / ideal if ideal > 0 else 0.0


@TASKS.register("ltr_diversity")
class DiversityLTRTask(RankingTask):
    """Queries with subtopics; reward α-NDCG@k (intent-aware diversity)."""

    name = "ltr_diversity"

    def __init__(
        self,
        train_size: int = 200,
        eval_size: int = 200,
        docs_per_query: int = 40,
        num_features: int = 24,
        subtopics: int = 4,
        alpha: float = 0.5,
        noise: float = 0.3,
        seed: int = 0,
        k: int = 10,
        max_train_queries: int = 0,
    ) -> None:
        if not 2 <= subtopics <= len(_SUBTOPIC_DIRECTIONS):
            raise ValueError(f"ltr_diversity: subtopics must be in [2, 8], got {subtopics}")
        if not 0 < alpha < 1:
            raise ValueError(f"ltr_diversity: alpha must be in (0, 1), got {alpha}")
        if num_features < LATENT:
            raise ValueError(f"ltr_diversity: num_features must be >= {LATENT}")
        rng = np.random.default_rng(seed)
        thresholds = np.array([0.3] + [1.6] * (subtopics - 1))
        self.alpha = alpha
        self.subtopics: dict[str, list[np.ndarray]] = {}
        splits = {}
        for split, count in (("train", train_size), ("eval", eval_size)):
            queries, judged = [], []
            for q in range(count):
                z = rng.normal(size=(docs_per_query, LATENT)) + rng.normal(scale=0.5, size=LATENT)
                u = z @ _SUBTOPIC_DIRECTIONS[:subtopics].T * 2.0
                j = (u + rng.normal(scale=noise, size=u.shape) > thresholds).astype(np.float64)
                labels = np.minimum(j.sum(1), 4.0)
                x = observed_features(z, num_features, rng)
                queries.append(LetorQuery(f"{split[0]}{q}", labels, x))
                judged.append(j)
            splits[split] = queries
            self.subtopics[split] = judged
        super().__init__(splits, k, max_train_queries)
        if max_train_queries:
            self.subtopics["train"] = self.subtopics["train"][:max_train_queries]
        self._judged = {
            tuple(r["items"]): j
            for split in self.queries
            for r, j in zip(self._rows[split], self.subtopics[split], strict=True)
        }

    def judgements(self, row: dict[str, Any]) -> np.ndarray:
        return self._judged[tuple(row["items"])]

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        ranking = parse_ranking(completion, len(row["labels"]), row.get("items"))
        if ranking is None:
            return None
        return alpha_ndcg(self.judgements(row), ranking, self.k, self.alpha)

    def eval_metrics(self, completions: list[str], rows: list[dict[str, Any]]) -> dict[str, float]:
        out = super().eval_metrics(completions, rows)
        values = [self.verify(c, r) or 0.0 for c, r in zip(completions, rows, strict=True)]
        out[f"eval/alpha_ndcg@{self.k}"] = sum(values) / max(len(values), 1)
        return out

    def ranking_alpha_ndcg(self, split: str, scores: list[np.ndarray], limit: int = 0) -> float:
        """Mean α-NDCG@k of the rankings by descending scores (for the label-trained
        references)."""
        judged = self.subtopics[split][:limit] if limit else self.subtopics[split]
        values = [
            alpha_ndcg(j, list(np.argsort(-s, kind="stable")), self.k, self.alpha)
            for j, s in zip(judged, scores, strict=True)
        ]
        return float(np.mean(values))
