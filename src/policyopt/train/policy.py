"""The policy of a run, of the kind its task declares (`Task.policy`).

- `"lm"`: a causal LM by name or path (`models.loading.load_model`).
- `"ranking"`: a Plackett–Luce scorer of a learning-to-rank task's items
  (`tasks.ranking.RankingTask`): a new one by architecture name (`models.ranker.RANKERS`:
  `pl-mlp`, `pl-linear`; the feature normaliser fitted on the task's training items) or a
  ranking checkpoint folder; either way the task's item table is attached.

`model.name_or_path` is read within the declared kind's names; a name of the other kind is an
error that says which kind the task trains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from policyopt.config.load import ModelConfig
from policyopt.models.item_tokenizer import ItemTokenizer
from policyopt.models.ranker import RANKERS, PLRanker
from policyopt.tasks.base import Task


def load_policy(model: ModelConfig, task: Task) -> tuple[Any, Any]:
    """(model, tokenizer) for `model.name_or_path` on `task`, of the kind `task.policy`."""
    if task.policy not in POLICY_LOADERS:
        raise ValueError(
            f"task {task.name!r} declares policy {task.policy!r}; the policy kinds are "
            f"{', '.join(sorted(POLICY_LOADERS))}"
        )
    return POLICY_LOADERS[task.policy](model, task)


def _language_model(model: ModelConfig, task: Task) -> tuple[Any, Any]:
    name = model.name_or_path
    if name in RANKERS or PLRanker.is_checkpoint(name):  # not a path or repo load_model reads
        raise ValueError(
            f"model {name!r} is a ranking policy, but task {task.name!r} trains a "
            "language model; use a learning-to-rank task (ltr_synthetic, letor, mslr)"
        )
    from policyopt.models.loading import load_model  # transformers: only for an LM

    return load_model(
        name,
        dtype=model.dtype,
        device=model.device,
        trust_remote_code=model.trust_remote_code,
    )


def _ranker(model: ModelConfig, task: Task) -> tuple[Any, Any]:
    name = model.name_or_path
    features = task.item_features  # type: ignore[attr-defined]  (a ranking task's items)
    if name in RANKERS:
        ranker = PLRanker(features.shape[1], RANKERS[name])
        ranker.set_items(features)
        ranker.fit_normalizer(torch.from_numpy(task.split_items["train"]))  # type: ignore[attr-defined]
    elif PLRanker.is_checkpoint(name):
        ranker = PLRanker.from_pretrained(name)
        ranker.set_items(features)
    else:
        raise ValueError(
            f"task {task.name!r} is a learning-to-rank task for a ranking policy (its prompts "
            f"are item ids, its items feature vectors a language model never sees), but "
            f"model.name_or_path={name!r} is a language model: use model.name_or_path=pl-mlp "
            "or pl-linear (or a ranking checkpoint folder) with rollout.engine=pl, or task "
            "rerank for an LM reranker"
        )
    return ranker.to(model.device), ItemTokenizer(features.shape[0])


# Task.policy -> the loader of that kind of policy.
POLICY_LOADERS: dict[str, Callable[[ModelConfig, Task], tuple[Any, Any]]] = {
    "lm": _language_model,
    "ranking": _ranker,
}
