"""Reference rankers on a ranking task's split, for SRPO's comparisons (SPEC §6).

- LightGBM LambdaRank (`lightgbm`, the `rank` extra) on the raw features (trees need no
  normalisation): the classic learning-to-rank baseline. Defaults are those measured in
  CALIBRATION.md (300 trees, learning rate 0.05, 31 leaves).
- A supervised listwise softmax on full labels with the same PL scorer as the policy:
  cross-entropy between the normalised gains (2^l − 1)/Σ(2^l − 1) and softmax(s) over each
  query's candidates (the softmax cross-entropy of Bruch et al. 2019, a ListNet variant). It sees every label, which RL from NDCG rewards never does: an
  upper reference for the scorer.
Both return the mean held-out NDCG@k over the first `eval_size` held-out queries (0: all).
"""

from __future__ import annotations

import torch

from policyopt.models.ranker import RANKERS, PLRanker
from policyopt.tasks.ranking import RankingTask


def lambdarank_ndcg(
    task: RankingTask,
    k: int = 10,
    *,
    trees: int = 300,
    learning_rate: float = 0.05,
    leaves: int = 31,
    seed: int = 0,
    eval_size: int = 0,
) -> float | None:
    """Held-out NDCG@k of LightGBM LambdaRank; None when lightgbm is not installed."""
    try:
        import lightgbm
    except ImportError:
        return None
    x, y, groups = task.arrays("train")
    model = lightgbm.LGBMRanker(
        objective="lambdarank",
        n_estimators=trees,
        learning_rate=learning_rate,
        num_leaves=leaves,
        random_state=seed,
        n_jobs=1,
        verbose=-1,
    )
    model.fit(x, y.astype(int), group=groups)
    queries = _held_out(task, eval_size)
    scores = [model.predict(q.features) for q in queries]
    return task.ranking_ndcg("eval", scores, k, limit=len(queries))


def listwise_softmax_ndcg(
    task: RankingTask,
    k: int = 10,
    *,
    model: str = "pl-mlp",
    steps: int = 300,
    lr: float = 3e-3,
    seed: int = 0,
    eval_size: int = 0,
) -> float:
    """Held-out NDCG@k of the PL scorer trained by listwise softmax on full labels (Adam,
    full batch: every training query with a relevant item, each step)."""
    torch.manual_seed(seed)
    ranker = PLRanker(task.num_features, RANKERS[model])
    ranker.set_items(task.item_features)
    ranker.fit_normalizer(torch.from_numpy(task.split_items["train"]))
    rows = [r for r in task.rows("train") if max(r["labels"]) > 0]
    items, mask = _padded([r["items"] for r in rows])
    gains, _ = _padded([[2.0**v - 1 for v in r["labels"]] for r in rows], dtype=torch.float32)
    target = gains / gains.sum(1, keepdim=True)  # Bruch et al. 2019: normalised gains
    optimizer = torch.optim.Adam(ranker.parameters(), lr=lr)
    for _ in range(steps):
        logp = torch.log_softmax(ranker.scores(items, mask), dim=1)
        loss = -(target * logp.masked_fill(mask == 0, 0.0)).sum(1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    queries = _held_out(task, eval_size)
    held_out, held_mask = _padded([r["items"] for r in task.rows("eval")][: len(queries)])
    with torch.no_grad():
        s = ranker.scores(held_out, held_mask).double().numpy()
    scores = [s[i, : len(q.labels)] for i, q in enumerate(queries)]
    return task.ranking_ndcg("eval", scores, k, limit=len(queries))


def _padded(
    lists: list[list], dtype: torch.dtype = torch.long
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [Q, P] values and mask (1 = value)."""
    width = max(len(x) for x in lists)
    values = torch.zeros(len(lists), width, dtype=dtype)
    mask = torch.zeros(len(lists), width, dtype=torch.long)
    for i, x in enumerate(lists):
        values[i, : len(x)] = torch.tensor(x, dtype=dtype)
        mask[i, : len(x)] = 1
    return values, mask


def _held_out(task: RankingTask, eval_size: int) -> list:
    queries = task.queries["eval"]
    return queries[:eval_size] if eval_size else queries
