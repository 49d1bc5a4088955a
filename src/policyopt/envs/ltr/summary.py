"""What a ranking run's summary adds: held-out NDCG@10 before and after RL, and the
references on the same held-out queries (the oracle's where the task knows the true
utility, LightGBM LambdaRank's, and the supervised listwise softmax's)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from policyopt.config.load import Config
from policyopt.envs.ltr.baselines import (
    lambdarank_ndcg,
    lambdarank_tuned,
    listwise_softmax_ndcg,
)
from policyopt.tasks.base import Task
from policyopt.tasks.ranking import RankingTask

K = 10


def ranking_summary(
    config: Config,
    task: Task,
    initial: dict[str, float],
    final: dict[str, float],
    console: Console,
) -> dict[str, Any]:
    """{} for a task that is not a ranking task."""
    if not isinstance(task, RankingTask):
        return {}
    size = config.eval.size
    oracle = getattr(task, "oracle_ndcg", None)
    lambdarank = lambdarank_ndcg(task, K, seed=config.train.seed, eval_size=size)
    if lambdarank is None:
        console.print(
            "note: lightgbm is not installed, so lambdarank_ndcg@10 is null "
            "(pip install 'policyopt[rank]')"
        )
    tuned = lambdarank_tuned(task, K, seed=config.train.seed, eval_size=size)
    return {
        f"initial_ndcg@{K}": initial[f"eval/ndcg@{K}"],
        f"final_ndcg@{K}": final[f"eval/ndcg@{K}"],
        f"oracle_ndcg@{K}": oracle("eval", K, limit=size) if oracle is not None else None,
        f"lambdarank_ndcg@{K}": lambdarank,
        f"lambdarank_tuned_ndcg@{K}": None if tuned is None else tuned["ndcg"],
        f"listwise_softmax_ndcg@{K}": listwise_softmax_ndcg(
            task, K, model=_scorer(config), seed=config.train.seed, eval_size=size
        ),
    }


def _scorer(config: Config) -> str:
    from policyopt.models.ranker import RANKERS

    name = config.model.name_or_path
    return name if name in RANKERS else "pl-mlp"
