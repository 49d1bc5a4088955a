"""The click-feedback task (position-based model) and the α-NDCG diversity task, by hand."""

import math

import numpy as np
import pytest

from policyopt.envs.ltr.clicks import click_probabilities
from policyopt.envs.ltr.diversity import alpha_dcg, alpha_ndcg, ideal_alpha_dcg
from policyopt.tasks import TASKS


def test_click_probabilities_by_hand():
    # θ_r = 1/r; ε(4) = 1, ε(0) = 0.1, ε(2) = 0.1 + 0.9 · 3/15 = 0.28.
    p = click_probabilities(np.array([4.0, 0.0, 2.0]), eta=1.0, eps_minus=0.1, eps_plus=1.0)
    assert p.tolist() == pytest.approx([1.0, 0.1 / 2, 0.28 / 3])
    # η = 0: no position bias.
    assert click_probabilities(np.array([0.0, 0.0]), eta=0.0).tolist() == [0.1, 0.1]


def test_click_reward_is_a_noisy_draw_with_the_model_mean():
    task = TASKS.get("ltr_clicks")(train_size=2, eval_size=1, docs_per_query=120, click_seed=3)
    row = task.rows("train")[0]
    ranking = list(np.argsort(-np.asarray(row["labels"]), kind="stable"))
    text = " ".join(f"i{row['items'][i]}" for i in ranking)
    draws = [task.verify(text, row) for _ in range(4000)]
    assert len(row["labels"]) == 120
    assert all(d == int(d) and 0 <= d <= 10 for d in draws)
    assert np.std(draws) > 0.3  # noisy: one ranking, many different rewards
    expected = task.expected_clicks(ranking, row["labels"])
    want = click_probabilities(np.sort(row["labels"])[::-1][:10]).sum()
    assert expected == pytest.approx(want)
    assert np.mean(draws) == pytest.approx(expected, abs=4 * np.std(draws) / math.sqrt(4000))
    # A worse ranking (reversed) gets fewer clicks in expectation.
    assert task.expected_clicks(ranking[::-1], row["labels"]) < expected
    with pytest.raises(ValueError, match="eps_minus"):
        TASKS.get("ltr_clicks")(train_size=1, eval_size=1, eps_minus=0.5, eps_plus=0.2)


def test_alpha_ndcg_by_hand():
    # d0 and d1 cover subtopic 0, d2 subtopic 1; α = 0.5, k = 3.
    j = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    # [0, 1, 2]: gains 1, 0.5 (subtopic 0 seen once), 1 -> 1 + 0.5/log2 3 + 1/2.
    dcg = 1 + 0.5 / math.log2(3) + 0.5
    assert alpha_dcg(j, [0, 1, 2], 3, 0.5) == pytest.approx(dcg)
    # Greedy ideal: d0 (1), d2 (1), d1 (0.5): 1 + 1/log2 3 + 0.5/2.
    ideal = 1 + 1 / math.log2(3) + 0.25
    assert ideal_alpha_dcg(j, 3, 0.5) == pytest.approx(ideal)
    assert alpha_ndcg(j, [0, 1, 2], 3) == pytest.approx(dcg / ideal)
    assert alpha_ndcg(j, [0, 2, 1], 3) == pytest.approx(1.0)
    # A document covering both subtopics first: gain 2, then d0 0.5, d2 0.5 (α = 0.5).
    j2 = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert alpha_dcg(j2, [0, 1, 2], 3, 0.5) == pytest.approx(2 + 0.5 / math.log2(3) + 0.25)
    assert alpha_ndcg(np.zeros((3, 2)), [0, 1, 2], 3) == 0.0


def test_diversity_task_rewards_alpha_ndcg_not_label_order():
    task = TASKS.get("ltr_diversity")(train_size=30, eval_size=2, docs_per_query=40)
    rows = task.rows("train")
    gaps = []
    for r in rows:
        j = task.judgements(r)
        assert np.array_equal(np.minimum(j.sum(1), 4), r["labels"])
        by_label = list(np.argsort(-np.asarray(r["labels"]), kind="stable"))
        text = " ".join(f"i{r['items'][i]}" for i in by_label)
        assert task.verify(text, r) == pytest.approx(alpha_ndcg(j, by_label, 10))
        gaps.append(1.0 - alpha_ndcg(j, by_label, 10))
    # Subtopic 0 is common, the others rare; ranking by label (subtopic count) leaves room.
    assert np.mean([task.judgements(r)[:, 0].mean() for r in rows]) > 0.2
    assert np.mean(gaps) > 0.02
