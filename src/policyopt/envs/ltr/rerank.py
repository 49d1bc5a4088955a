"""`rerank`: a language model reads a query and numbered candidates and emits a ranking.

SRPO's second scenario (an LLM reranker emitting a permutation), small enough for the
embedded tiny model. A query is a target number; each candidate a number; a candidate's
graded relevance is how close it is to the target (|c − q| <= 1: 3, <= 5: 2, <= 15: 1,
else 0). The prompt and the expected form of the answer, best first:

    prompt    Query: 42\\n[1] 17\\n[2] 40\\n[3] 43\\n[4] 90\\nRank:
    solution  [3] > [2] > [1] > [4]

The reward is NDCG@k of the parsed ranking (`rewards.ranking`: repeats and unknown
numbers skipped, missing candidates left out of the list); a completion that names no
candidate is unparseable (a logged 0). The expert solution is the ranking by closeness;
`shuffled_fraction` of the supervised warm-up targets are random orders instead, so that
the warm start ranks imperfectly and RL has something to improve.
"""

from __future__ import annotations

import random
from typing import Any

import datasets

from policyopt.rewards.ranked_text import parse_ranking, ranking_ndcg
from policyopt.tasks.base import TASKS, Task

BANDS = (1, 5, 15)  # |c − q| at most these: labels 3, 2, 1


def relevance(query: int, candidate: int) -> float:
    return float(sum(abs(candidate - query) <= b for b in BANDS))


def ideal_ranking(labels: list[float], candidates: list[int], query: int) -> list[int]:
    """Candidate indices by label, then by closeness (a strict order for the solution)."""
    return sorted(range(len(labels)), key=lambda i: (-labels[i], abs(candidates[i] - query), i))


def format_ranking(ranking: list[int]) -> str:
    return " > ".join(f"[{i + 1}]" for i in ranking)


@TASKS.register("rerank")
class RerankTask(Task):
    name = "rerank"
    random_start = True
    answer_column = "labels"
    solution_column = "solution"

    def __init__(
        self,
        train_size: int = 2000,
        eval_size: int = 200,
        candidates: int = 4,
        k: int = 4,
        shuffled_fraction: float = 0.5,
        seed: int = 0,
    ) -> None:
        if not 2 <= candidates <= 9:
            raise ValueError(f"rerank: candidates must be in 2..9, got {candidates}")
        if not 0 <= shuffled_fraction <= 1:
            raise ValueError(
                f"rerank: shuffled_fraction must be in [0, 1], got {shuffled_fraction}"
            )
        self.k, self.shuffled_fraction, self.seed = k, shuffled_fraction, seed
        rng = random.Random(seed)
        self._rows = {
            "eval": [self._row(rng, candidates) for _ in range(eval_size)],
            "train": [self._row(rng, candidates) for _ in range(train_size)],
        }

    def _row(self, rng: random.Random, n: int) -> dict[str, Any]:
        query = rng.randint(10, 89)
        # Mix near and far candidates so that labels vary within a query.
        cands = [
            min(99, max(0, query + rng.choice([-1, 1]) * rng.randint(0, 20))) for _ in range(n)
        ]
        labels = [relevance(query, c) for c in cands]
        lines = "\n".join(f"[{i + 1}] {c}" for i, c in enumerate(cands))
        return {
            "prompt": f"Query: {query}\n{lines}\nRank:",
            "labels": labels,
            "solution": format_ranking(ideal_ranking(labels, cands, query)),
            "ndcg_k": self.k,
        }

    def rows(self, split: str) -> datasets.Dataset:
        return datasets.Dataset.from_list(self._rows[split])

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        return ranking_ndcg(completion, row, self.k)

    def eval_metrics(self, completions: list[str], rows: list[dict[str, Any]]) -> dict[str, float]:
        """With every held-out evaluation: how many greedy rankings parse, how many are
        complete, and their NDCG among the parsed (`parse_metrics`)."""
        return parse_metrics(completions, rows)

    def extract_answer(self, completion: str) -> str | None:
        ranking = parse_ranking(completion, 9)
        return None if ranking is None else format_ranking(ranking)

    def sft_targets(self, row: dict[str, Any]) -> list[str]:
        """The expert ranking, or (for `shuffled_fraction` of rows) a random order."""
        rng = random.Random(f"{self.seed}:{row['prompt']}")
        if rng.random() < self.shuffled_fraction:
            order = list(range(len(row["labels"])))
            rng.shuffle(order)
            return [format_ranking(order)]
        return self.expert_solutions(row)


def parse_metrics(completions: list[str], rows: list[dict[str, Any]]) -> dict[str, float]:
    """Parse rate, complete rate (a ranking of every candidate) and mean NDCG@k among the
    parsed completions."""
    parsed = complete = 0
    scores: list[float] = []
    for text, row in zip(completions, rows, strict=True):
        n = len(row["labels"])
        ranking = parse_ranking(text, n, row.get("items"))
        if ranking is None:
            continue
        parsed += 1
        complete += len(ranking) == n
        scores.append(float(ranking_ndcg(text, row)))
    total = max(len(rows), 1)
    return {
        "eval/parse_rate": parsed / total,
        "eval/complete_rate": complete / total,
        "eval/ndcg_parsed": sum(scores) / len(scores) if scores else 0.0,
    }
