"""Per-group evaluation numbers, worked by hand."""

import pytest

from policyopt.tasks import get_task
from policyopt.trainer.evaluate import grouped_scores


def test_grouped_scores_by_level() -> None:
    task = get_task("arithmetic", train_size=10, eval_size=10)
    rows = [{"level": 1}, {"level": 1}, {"level": 2}, {"level": 2}, {"level": 2}]
    scores = [1.0, 0.0, 1.0, 1.0, 0.5]
    out = grouped_scores(task, rows, scores)
    assert out["eval/level_1/accuracy"] == 0.5
    assert out["eval/level_1/reward"] == 0.5
    assert out["eval/level_2/accuracy"] == pytest.approx(2 / 3)
    assert out["eval/level_2/reward"] == pytest.approx(2.5 / 3)
