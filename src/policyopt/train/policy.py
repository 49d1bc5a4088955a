"""The policy of a run, of the kind its task declares (`Task.policy`).

- `"lm"`: a causal LM by name or path (`models.loading.load_model`).
- `"ranking"`: a Plackett–Luce scorer of a learning-to-rank task's items
  (`tasks.ranking.RankingTask`): a new one by architecture name (`models.ranker.RANKERS`:
  `pl-mlp`, `pl-linear`; the feature normaliser fitted on the task's training items) or a
  ranking checkpoint folder; either way the task's item table is attached.

`model.name_or_path` is read within the declared kind's names; a name of the other kind is an
error that says which kind the task trains. A policyopt checkpoint folder (`.../checkpoints/
step-N`, or its `merged/` LoRA weights) is loaded only if it is complete
(`refuse_incomplete_checkpoint`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from policyopt.config.load import ModelConfig
from policyopt.models.item_tokenizer import ItemTokenizer
from policyopt.models.ranker import RANKERS, PLRanker
from policyopt.store.checkpoint import PREFIX, is_complete, latest_checkpoint
from policyopt.tasks.base import Task


def load_policy(model: ModelConfig, task: Task) -> tuple[Any, Any]:
    """(model, tokenizer) for `model.name_or_path` on `task`, of the kind `task.policy`."""
    if task.policy not in POLICY_LOADERS:
        raise ValueError(
            f"task {task.name!r} declares policy {task.policy!r}; the policy kinds are "
            f"{', '.join(sorted(POLICY_LOADERS))}"
        )
    refuse_incomplete_checkpoint(model.name_or_path, "model.name_or_path=")
    return POLICY_LOADERS[task.policy](model, task)


def checkpoint_of(name: str) -> Path | None:
    """The policyopt checkpoint folder that `name` is, or whose `merged/` folder it is;
    None for anything else (a model name, a plain model folder, a run folder)."""
    path = Path(name).expanduser()
    if path.name == "merged":
        path = path.parent
    inside = path.parent.name == "checkpoints" and path.name.startswith(PREFIX)
    return path if inside and path.name[len(PREFIX) :].isdigit() and path.is_dir() else None


def refuse_incomplete_checkpoint(name: str, setting: str) -> None:
    """Raise if `name` is a policyopt checkpoint folder that is not complete (its COMPLETE
    marker missing, or a file it lists missing or of another size): a save was interrupted,
    and its weights may be partial. `setting` is how the name was given (`--model `,
    `model.name_or_path=`); the message names the newest complete checkpoint of the same
    run, if there is one, as that setting."""
    checkpoint = checkpoint_of(name)
    if checkpoint is None or is_complete(checkpoint):
        return
    found = latest_checkpoint(checkpoint.parent.parent)
    instead = (
        f"the newest complete checkpoint of its run is {found.name}: give {setting}{found}"
        if found is not None
        else "its run has no complete checkpoint"
    )
    raise FileNotFoundError(
        f"checkpoint {name} is incomplete (a save was interrupted, or a file is missing or "
        f"truncated); {instead}"
    )


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
