"""Learning-to-rank tasks: the LETOR reader, the synthetic generator, NDCG verification."""

import numpy as np
import pytest

from policyopt.rewards.ranked_text import ndcg_reward, parse_ranking
from policyopt.tasks import get_task
from policyopt.tasks.letor import read_letor
from policyopt.tasks.mslr_data import mslr_paths

LETOR = """2 qid:1 1:0.5 3:2 # doc a
0 qid:1 2:1.5
1 qid:1 1:-1 2:0 3:4
0 qid:7 1:3
3 qid:7 2:1
"""


def test_read_letor(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(LETOR)
    queries = read_letor(path)
    assert [q.qid for q in queries] == ["1", "7"]
    assert queries[0].labels.tolist() == [2, 0, 1]
    assert queries[0].features.tolist() == [[0.5, 0, 2], [0, 1.5, 0], [-1, 0, 4]]
    assert queries[1].features.shape == (2, 3)


def test_read_letor_errors(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1 q:1 1:2\n")
    with pytest.raises(ValueError, match=r"bad.txt:1: not a LETOR line"):
        read_letor(bad)
    split = tmp_path / "split.txt"
    split.write_text("1 qid:1 1:1\n0 qid:2 1:1\n0 qid:1 1:2\n")
    with pytest.raises(ValueError, match="not contiguous"):
        read_letor(split)
    with pytest.raises(FileNotFoundError):
        read_letor(tmp_path / "missing.txt")


def test_letor_task_rows_and_verify(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text(LETOR)
    task = get_task("letor", train_path=str(path), eval_path=str(path), k=3)
    rows = task.rows("train")
    assert rows[0]["items"] == [1, 2, 3] and rows[1]["items"] == [4, 5]
    assert task.rows("eval")[0]["items"] == [6, 7, 8]
    assert task.item_features.shape == (10, 3)
    row = rows[0]
    assert task.verify("i1 i3 i2", row) == pytest.approx(1.0)  # labels 2, 1, 0
    assert task.verify("nothing", row) is None
    metrics = task.eval_metrics(["i1 i3 i2", "i4 i5"], [rows[0], rows[1]])
    assert metrics["eval/ndcg@1"] == pytest.approx(0.5)  # second query: label 0 first


def test_parse_ranking_forms():
    assert parse_ranking("[3] > [1] > [2]", 3) == [2, 0, 1]
    assert parse_ranking("[2] > [2] > [9] > [1]", 3) == [1, 0]  # repeats, unknowns skipped
    assert parse_ranking("no ranking", 3) is None
    assert parse_ranking("i12 i10", 3, items=[10, 11, 12]) == [2, 0]
    got = ndcg_reward(["p"], ["[2] > [1]"], labels=[[0, 1]])
    assert got == [pytest.approx(1.0)]
    assert ndcg_reward(["p"], ["??"], labels=[[0, 1]]) == [None]


def test_synthetic_task_is_deterministic_with_oracle_below_one():
    a = get_task("ltr_synthetic", train_size=5, eval_size=20, docs_per_query=10, seed=3)
    b = get_task("ltr_synthetic", train_size=5, eval_size=20, docs_per_query=10, seed=3)
    assert np.array_equal(a.arrays("eval")[0], b.arrays("eval")[0])
    assert a.item_features.shape == (250, 24)
    oracle = a.oracle_ndcg("eval", 10)
    assert 0.5 < oracle <= 1.0
    # A random ranking does worse than the true utility on average.
    rng = np.random.default_rng(0)
    random_scores = [rng.normal(size=10) for _ in range(20)]
    assert a.ranking_ndcg("eval", random_scores, 10) < oracle
    assert len(get_task("ltr_synthetic", train_size=5, max_train_queries=2).rows("train")) == 2


def test_mslr_missing_names_the_fetch_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="policyopt data fetch mslr"):
        mslr_paths(tmp_path)


def test_mslr_subset_when_fetched():
    try:
        mslr_paths()
    except FileNotFoundError:
        pytest.skip("MSLR subset not fetched (policyopt data fetch mslr)")
    task = get_task("mslr")
    assert len(task.rows("train")) == 43 and len(task.rows("eval")) == 43
    assert task.num_features == 136
