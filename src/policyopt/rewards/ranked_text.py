"""Ranking rewards: parse a ranked list from a completion, score it with NDCG@k.

Two written forms of a ranking, best first:
- a ranking policy's (`models.item_tokenizer`): item ids `i12 i7 i40`, mapped to the
  query's candidates through the row's `items` column;
- a language model's: candidate numbers `[3] > [1] > [2]` (1-based, as the prompt numbers
  the candidates).
Repeated and unknown candidates are skipped; a completion with no candidate at all is
unparseable (None: the pipeline logs it and scores it 0).
"""

from __future__ import annotations

import re
from typing import Any

from policyopt.core.ndcg import ndcg
from policyopt.models.item_tokenizer import ITEM
from policyopt.rewards.functions import REWARD_FUNCTIONS

BRACKET = re.compile(r"\[\s*(\d+)\s*\]")
DEFAULT_K = 10


def parse_ranking(
    completion: str, num_candidates: int, items: list[int] | None = None
) -> list[int] | None:
    """0-based candidate indices, best first; None when no candidate is named."""
    if items is not None:
        where = {int(item): i for i, item in enumerate(items)}
        found = [where.get(int(m)) for m in ITEM.findall(completion)]
    else:
        found = [int(m) - 1 for m in BRACKET.findall(completion)]
    out: list[int] = []
    for i in found:
        if i is not None and 0 <= i < num_candidates and i not in out:
            out.append(i)
    return out or None


def ranking_ndcg(completion: str, row: dict[str, Any], k: int | None = None) -> float | None:
    """NDCG@k of the ranking in `completion` against the row's `labels` (k: the row's
    `ndcg_k`, else 10); None if unparseable."""
    labels = list(row["labels"])
    ranking = parse_ranking(completion, len(labels), row.get("items"))
    if ranking is None:
        return None
    return ndcg(labels, ranking, k or int(row.get("ndcg_k") or DEFAULT_K))


@REWARD_FUNCTIONS.register("ndcg")
def ndcg_reward(
    prompts: list[str], completions: list[str], *, labels: list[list[float]], **columns: Any
) -> list[float | None]:
    """NDCG@k of each completion's parsed ranking (columns: `labels`, and optionally
    `items` for item-id rankings and `ndcg_k` for k)."""
    items = columns.get("items")
    ks = columns.get("ndcg_k")
    return [
        ranking_ndcg(
            c,
            {"labels": labels[i], "items": None if items is None else items[i]},
            None if ks is None else int(ks[i]),
        )
        for i, c in enumerate(completions)
    ]
