"""The policy of a run: a causal LM by name or path, or a ranking policy built on its task.

Ranking policies (`models.ranker.RANKERS`: `pl-mlp`, `pl-linear`) score the items of a
learning-to-rank task (`tasks.ranking.RankingTask`): the task's item table is attached and
the feature normaliser fitted on its training items. A ranking checkpoint folder (one with
`ranker_config.json`) loads as a ranking policy too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from policyopt.models.item_tokenizer import ItemTokenizer
from policyopt.models.ranker import RANKERS, PLRanker
from policyopt.tasks.base import Task
from policyopt.trainer.config import ModelConfig


def is_ranker_name(name_or_path: str) -> bool:
    return name_or_path in RANKERS or (Path(name_or_path) / "ranker_config.json").is_file()


def load_policy(model: ModelConfig, task: Task) -> tuple[Any, Any]:
    """(model, tokenizer) for `model.name_or_path` on `task`."""
    name = model.name_or_path
    features = getattr(task, "item_features", None)
    if not is_ranker_name(name) and features is not None:
        raise ValueError(
            f"task {task.name!r} is a learning-to-rank task for a ranking policy (its prompts "
            f"are item ids, its items feature vectors a language model never sees), but "
            f"model.name_or_path={name!r} is a language model: use model.name_or_path=pl-mlp "
            "or pl-linear with rollout.engine=pl, or task rerank for an LM reranker"
        )
    if not is_ranker_name(name):
        from policyopt.models.loading import load_model

        return load_model(name, dtype=model.dtype, device=model.device)
    if features is None:
        raise ValueError(
            f"model {name!r} is a ranking policy, but task {task.name!r} has no item features; "
            "use a learning-to-rank task (ltr_synthetic, letor, mslr)"
        )
    if name in RANKERS:
        ranker = PLRanker(features.shape[1], RANKERS[name])
        ranker.set_items(features)
        ranker.fit_normalizer(torch.from_numpy(task.split_items["train"]))
    else:
        ranker = PLRanker.from_pretrained(name)
        ranker.set_items(features)
    return ranker.to(model.device), ItemTokenizer(features.shape[0])
