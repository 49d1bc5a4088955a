"""Reference rankers on a ranking task's split, for SRPO's comparisons (SPEC §6).

- LightGBM LambdaRank (`lightgbm`, the `rank` extra) on the raw features (trees need no
  normalisation): the classic learning-to-rank baseline. Defaults are those measured in
  CALIBRATION.md (300 trees, learning rate 0.05, 31 leaves).
- LambdaRank tuned (`lambdarank_tuned`): the training queries split 80/20 into fit and
  validation queries; a grid over leaves {7, 15, 31} × learning rate {0.03, 0.1} × min
  documents per leaf {5, 20}, each with up to 500 trees and early stopping on the validation
  NDCG@k (patience 30); the best cell by validation NDCG@k is scored on the held-out split.
- A supervised listwise softmax on full labels with the same PL scorer as the policy:
  cross-entropy between the normalised gains (2^l − 1)/Σ(2^l − 1) and softmax(s) over each
  query's candidates (the softmax cross-entropy of Bruch et al. 2019, a ListNet variant). It sees every label, which RL from NDCG rewards never does: an
  upper reference for the scorer.
Both return the mean held-out NDCG@k over the first `eval_size` held-out queries (0: all).
"""

from __future__ import annotations

from typing import Any

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


LAMBDARANK_GRID = {
    "num_leaves": (7, 15, 31),
    "learning_rate": (0.03, 0.1),
    "min_child_samples": (5, 20),
}


def lambdarank_tuned(
    task: RankingTask, k: int = 10, *, seed: int = 0, eval_size: int = 0
) -> dict[str, float] | None:
    """LambdaRank tuned on a validation split (module docstring): {"ndcg": held-out NDCG@k,
    "valid_ndcg": its validation NDCG@k, the chosen parameters and best iteration, and
    "alpha_ndcg" where the task scores α-NDCG}; None without lightgbm."""
    try:
        import lightgbm
    except ImportError:
        return None
    import itertools
    import warnings

    import numpy as np

    queries = task.queries["train"]
    order = np.random.default_rng(seed).permutation(len(queries))
    cut = max(1, int(0.8 * len(queries)))
    fit, valid = (
        [queries[i] for i in order[:cut]],
        [queries[i] for i in order[cut:]] or [queries[order[0]]],
    )

    def arrays(qs: list) -> tuple:
        return (
            np.concatenate([q.features for q in qs]),
            np.concatenate([q.labels for q in qs]).astype(int),
            [len(q.labels) for q in qs],
        )

    xf, yf, gf = arrays(fit)
    xv, yv, gv = arrays(valid)
    best: tuple[float, Any] | None = None
    for leaves, lr, child in itertools.product(*LAMBDARANK_GRID.values()):
        model = lightgbm.LGBMRanker(
            objective="lambdarank",
            n_estimators=500,
            learning_rate=lr,
            num_leaves=leaves,
            min_child_samples=child,
            random_state=seed,
            n_jobs=1,
            verbose=-1,
        )
        with warnings.catch_warnings():  # lightgbm >= 4.6 renames eval_set (still accepted)
            warnings.simplefilter("ignore")
            model.fit(
                xf,
                yf,
                group=gf,
                eval_set=[(xv, yv)],
                eval_group=[gv],
                eval_at=[k],
                callbacks=[lightgbm.early_stopping(30, verbose=False)],
            )
        score = float(model.best_score_["valid_0"][f"ndcg@{k}"])
        if best is None or score > best[0]:
            best = (score, model)
    assert best is not None
    score, model = best
    held = _held_out(task, eval_size)
    scores = [model.predict(q.features, num_iteration=model.best_iteration_) for q in held]
    out: dict[str, Any] = {
        "ndcg": task.ranking_ndcg("eval", scores, k, limit=len(held)),
        "valid_ndcg": score,
        "best_iteration": float(model.best_iteration_ or 0),
        **{key: float(model.get_params()[key]) for key in LAMBDARANK_GRID},
    }
    alpha = getattr(task, "ranking_alpha_ndcg", None)
    if alpha is not None:
        out["alpha_ndcg"] = alpha("eval", scores, limit=len(held))
    return out


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
