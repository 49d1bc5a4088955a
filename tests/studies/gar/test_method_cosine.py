"""The GAR expert-method analysis: style split, paired summary by hand, an end-to-end run."""

import json
import math

import pytest
from studies.gar.method_cosine import main, summarise

from policyopt.tasks.arithmetic import ArithmeticTask, solution_style


def test_solution_style() -> None:
    assert solution_style("A:23") == solution_style(" A:7") == "terse"
    assert solution_style("7+12=19. A:19") == solution_style("") == "worked"


def test_summary_by_hand() -> None:
    by_problem = {
        0: {"worked": [0.8, 0.6], "terse": [0.1]},  # paired: 0.7 - 0.1 = 0.6
        1: {"worked": [0.2], "terse": [0.4, 0.6]},  # paired: 0.2 - 0.5 = -0.3
        2: {"worked": [0.9], "terse": []},  # not paired
    }
    out = summarise(by_problem, n_rollouts=12)
    assert out["worked_correct"] == 4 and out["terse_correct"] == 3
    assert out["worked_cosine_mean"] == pytest.approx((0.8 + 0.6 + 0.2 + 0.9) / 4)
    assert out["terse_cosine_mean"] == pytest.approx((0.1 + 0.4 + 0.6) / 3)
    assert out["paired_problems"] == 2
    assert out["paired_diff_mean"] == pytest.approx((0.6 - 0.3) / 2)
    assert out["paired_worked_higher_fraction"] == 0.5
    empty = summarise({0: {"worked": [0.5], "terse": []}}, n_rollouts=1)
    assert math.isnan(empty["terse_cosine_mean"]) and math.isnan(empty["paired_diff_mean"])


def test_end_to_end_on_the_tiny_model(tmp_path, monkeypatch) -> None:
    # The untrained model is never right: call every rollout correct to run the whole path.
    monkeypatch.setattr(ArithmeticTask, "verify", lambda self, completion, row: 1.0)
    out_file = tmp_path / "cosine.json"
    assert (
        main(["--model", "tiny", "--prompts", "3", "--samples", "2", "--json-out", str(out_file)])
        == 0
    )
    result = json.loads(out_file.read_text())
    assert result["rollouts"] == 6
    assert result["worked_correct"] + result["terse_correct"] == 6
    for style in ("worked", "terse"):
        mean = result[f"{style}_cosine_mean"]
        assert math.isnan(mean) or -1.0 - 1e-6 <= mean <= 1.0 + 1e-6
