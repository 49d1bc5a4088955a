"""Learning-to-rank tasks: a query's candidate items with graded labels and features.

A row is one query: `prompt` (its candidates as item ids, `i12 i13 ...`, what a ranking
policy reads), `items` (the ids), `labels` (graded relevance, one per candidate), `qid` and
`ndcg_k`. The items' feature vectors form the task's item table (`item_features`, item id
i is row i − 1); the ranking policy (`models.ranker`) scores them. The verifier is NDCG@k
of the parsed ranking (`rewards.ranking`), and evaluation also reports NDCG@1/5/10.

Tasks: `ltr_synthetic` (embedded, `tasks.ltr_synthetic`), `letor` (any pair of LETOR files)
and `mslr` (the MSLR-WEB subset shipped in rankeval 0.8.2's source package, fetched into
the cache by `policyopt data fetch mslr`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch

from policyopt.core.ndcg import ndcg
from policyopt.rewards.ranked_text import parse_ranking, ranking_ndcg
from policyopt.tasks.base import TASKS, Task
from policyopt.tasks.letor import LetorQuery, read_letor
from policyopt.tasks.mslr_data import mslr_paths

EVAL_KS = (1, 5, 10)


class RankingTask(Task):
    """Queries of two splits, their item table and NDCG@k as the verifier."""

    answer_column = "labels"
    solution_column = None
    policy = "ranking"  # a Plackett-Luce scorer of `item_features` (`models.ranker`)
    random_start = True  # initialised from the run's seed

    def __init__(
        self, splits: dict[str, list[LetorQuery]], k: int = 10, max_train_queries: int = 0
    ) -> None:
        if k < 1:
            raise ValueError(f"task option k (NDCG cutoff) must be >= 1, got {k}")
        if max_train_queries:
            splits = {**splits, "train": splits["train"][:max_train_queries]}
        self.k = k
        self.queries = splits
        features, self._rows, next_id = [], {}, 1
        self.split_items: dict[str, np.ndarray] = {}
        for split, queries in splits.items():
            rows = []
            for q in queries:
                ids = list(range(next_id, next_id + len(q.labels)))
                next_id += len(ids)
                features.append(q.features)
                rows.append(
                    {
                        "prompt": " ".join(f"i{i}" for i in ids),
                        "items": ids,
                        "labels": [float(v) for v in q.labels],
                        "qid": q.qid,
                        "ndcg_k": k,
                    }
                )
            self._rows[split] = rows
            self.split_items[split] = np.array(
                [i for r in rows for i in r["items"]], dtype=np.int64
            )
        widths = {f.shape[1] for f in features}
        if len(widths) != 1:
            raise ValueError(f"queries have different numbers of features: {sorted(widths)}")
        self.item_features = torch.from_numpy(np.concatenate(features)).float()

    @property
    def num_features(self) -> int:
        return self.item_features.shape[1]

    def rows(self, split: str) -> datasets.Dataset:
        if split not in self._rows:
            raise ValueError(f"task {self.name!r} has splits {sorted(self._rows)}, not {split!r}")
        return datasets.Dataset.from_list(self._rows[split])

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        return ranking_ndcg(completion, row, self.k)

    def eval_metrics(self, completions: list[str], rows: list[dict[str, Any]]) -> dict[str, float]:
        """Mean NDCG@1/5/10 of greedy rankings (unparseable: 0)."""
        out = {}
        for k in EVAL_KS:
            scores = [ranking_ndcg(c, r, k) or 0.0 for c, r in zip(completions, rows, strict=True)]
            out[f"eval/ndcg@{k}"] = sum(scores) / max(len(scores), 1)
        return out

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(features [docs, F], labels [docs], documents per query) for tree learners."""
        queries = self.queries[split]
        return (
            np.concatenate([q.features for q in queries]),
            np.concatenate([q.labels for q in queries]),
            [len(q.labels) for q in queries],
        )

    def ranking_ndcg(self, split: str, scores: list[np.ndarray], k: int, limit: int = 0) -> float:
        """Mean NDCG@k of the rankings by descending `scores` over a split's queries (the
        first `limit` of them; 0: all)."""
        queries = self.queries[split][:limit] if limit else self.queries[split]
        values = [
            ndcg(list(q.labels), list(np.argsort(-s, kind="stable")), k)
            for q, s in zip(queries, scores, strict=True)
        ]
        return float(np.mean(values))

    def parse(self, completion: str, row: dict[str, Any]) -> list[int] | None:
        return parse_ranking(completion, len(row["labels"]), row.get("items"))


@TASKS.register("letor")
class LetorTask(RankingTask):
    """Two LETOR files: `train_path` (training queries) and `eval_path` (held out)."""

    name = "letor"

    def __init__(
        self, train_path: str, eval_path: str, k: int = 10, max_train_queries: int = 0
    ) -> None:
        train = read_letor(train_path)
        width = train[0].features.shape[1]
        held_out = read_letor(eval_path, num_features=width)
        super().__init__({"train": train, "eval": held_out}, k, max_train_queries)


@TASKS.register("mslr")
class MSLRTask(LetorTask):
    """The MSLR-WEB10K fold-1 subset of rankeval 0.8.2 (43 + 43 queries, 136 features)."""

    name = "mslr"

    def __init__(self, k: int = 10, max_train_queries: int = 0, cache: str | None = None) -> None:
        train, test = mslr_paths(Path(cache) if cache else None)
        super().__init__(str(train), str(test), k, max_train_queries)
