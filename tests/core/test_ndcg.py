"""NDCG@k against trec_eval (pytrec_eval) and numbers worked by hand."""

import math
import random

import pytest
import torch

from policyopt.core.ndcg import ndcg
from policyopt.methods.srpo import ndcg_at_k

pytrec_eval = pytest.importorskip("pytrec_eval")


def test_hand_computed():
    # labels (2, 0, 1); ranking (2, 0, 1): DCG = 1/1 + 0 + 3/2; ideal (0, 2, 1): 3 + 1/log2 3.
    idcg = 3 + 1 / math.log2(3)
    got = ndcg_at_k(torch.tensor([[2.0, 0.0, 1.0]]), torch.tensor([[2, 1, 0]]), k=3)
    assert float(got[0]) == pytest.approx((1 + 0 + 3 / 2) / idcg)
    assert ndcg([2, 0, 1], [0, 2, 1], 3) == pytest.approx(1.0)
    assert ndcg([2, 0, 1], [2, 1, 0], 1) == pytest.approx(1 / 3)  # 1/(2^2 − 1)


def test_no_relevant_item_scores_zero_and_padding():
    assert ndcg([0, 0, 0], [2, 1, 0], 10) == 0.0
    # A shorter list (padding -1) omits relevant items: penalised against the full ideal.
    got = ndcg_at_k(torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([[0, -1, -1]]), k=3)
    assert float(got[0]) == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_against_trec_eval():
    """trec_eval's ndcg_cut uses the judged relevance as the gain, so we hand it 2^l − 1."""
    rng = random.Random(0)
    qrels, run, labels, rankings = {}, {}, [], []
    for q in range(30):
        n = 12
        lab = [rng.choice([0, 0, 0, 1, 2, 3, 4]) for _ in range(n)]
        if q == 0:
            lab[3] = 4
        if not any(lab):
            lab[0] = 1  # trec_eval skips queries without relevant documents
        order = list(range(n))
        rng.shuffle(order)
        labels.append(lab)
        rankings.append(order)
        qrels[f"q{q}"] = {f"d{i}": 2 ** lab[i] - 1 for i in range(n)}
        run[f"q{q}"] = {f"d{item}": float(n - r) for r, item in enumerate(order)}
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.1,5,10"})
    ref = ev.evaluate(run)
    for k in (1, 5, 10):
        ours = ndcg_at_k(torch.tensor(labels, dtype=torch.float64), torch.tensor(rankings), k)
        for q in range(30):
            assert float(ours[q]) == pytest.approx(ref[f"q{q}"][f"ndcg_cut_{k}"], abs=1e-4)


def test_errors():
    with pytest.raises(ValueError, match="k must be"):
        ndcg_at_k(torch.zeros(1, 2), torch.tensor([[0, 1]]), 0)
    with pytest.raises(ValueError, match="indices"):
        ndcg_at_k(torch.zeros(1, 2), torch.tensor([[0, 2]]), 1)


def test_plain_python_ndcg_equals_tensor_version():
    rng = random.Random(1)
    for _ in range(50):
        n = rng.randint(1, 15)
        labels = [rng.choice([0, 0, 1, 2, 3, 4]) for _ in range(n)]
        ranking = rng.sample(range(n), rng.randint(1, n))
        k = rng.randint(1, 12)
        padded = torch.tensor([ranking + [-1] * (n - len(ranking))])
        want = float(ndcg_at_k(torch.tensor([labels], dtype=torch.float64), padded, k)[0])
        assert ndcg(labels, ranking, k) == pytest.approx(want, abs=1e-12)
