"""Per-group evaluation numbers, worked by hand."""

import pytest

from policyopt.tasks import get_task
from policyopt.tasks.base import Task
from policyopt.train.held_out import grouped_scores, style_shares


def test_grouped_scores_by_level() -> None:
    task = get_task("arithmetic", train_size=10, eval_size=10)
    rows = [{"level": 1}, {"level": 1}, {"level": 2}, {"level": 2}, {"level": 2}]
    scores = [1.0, 0.0, 1.0, 1.0, 0.5]
    out = grouped_scores(task, rows, scores, correct_threshold=1.0)
    assert out["eval/level_1/accuracy"] == 0.5
    assert out["eval/level_1/reward"] == 0.5
    assert out["eval/level_2/accuracy"] == pytest.approx(2 / 3)
    assert out["eval/level_2/reward"] == pytest.approx(2.5 / 3)


def test_style_shares_overall_and_per_group() -> None:
    task = get_task("docparse", train_size=10, eval_size=10)
    rows = [
        {"element_type": "table"},
        {"element_type": "table"},
        {"element_type": "formula"},
        {"element_type": "formula"},
    ]
    texts = ["<table><tr></tr></table>", "a|b", "frac a over b", r"\frac{a}{b}"]
    out = style_shares(task, rows, texts)
    assert out == {
        "eval/style/markup": 0.5,
        "eval/style/ocr_text": 0.5,
        "eval/element_type_formula/style/markup": 0.5,
        "eval/element_type_formula/style/ocr_text": 0.5,
        "eval/element_type_table/style/markup": 0.5,
        "eval/element_type_table/style/ocr_text": 0.5,
    }
    arithmetic = get_task("arithmetic", train_size=10, eval_size=10)
    shares = style_shares(arithmetic, [{"level": 1}] * 4, ["A:3", "1+2=3. A:3", "A:4", "A:5"])
    assert shares["eval/style/terse"] == 0.75
    assert shares["eval/level_1/style/worked"] == 0.25
    # Every style of the task is reported, also one no answer has (stable keys for tables).
    assert style_shares(task, rows[:1], texts[:1])["eval/style/ocr_text"] == 0.0

    class NoStyles(Task):
        def rows(self, split):
            raise NotImplementedError

        def verify(self, completion, row):
            return 0.0

    assert style_shares(NoStyles(), [{}], ["x"]) == {}  # no styles: nothing reported

    class Odd(NoStyles):
        styles = ("a",)

        def output_style(self, completion, row):
            return "b"

    with pytest.raises(ValueError, match=r"output styles \['b'\] not in \('a',\)"):
        style_shares(Odd(), [{}], ["x"])


def test_evaluation_counts_correct_with_the_training_threshold(small_config, tmp_path) -> None:
    """One threshold (reward.correct_threshold) decides "correct" in training and in
    evaluation: a reward of 0.6 is correct under 0.5, in greedy accuracy, per-group accuracy,
    pass@k and avg@k alike, and not under 1.0 (maj@k also needs a parseable answer, which the
    untrained model rarely gives)."""
    from policyopt.train.trainer import Trainer

    for threshold, expected in ((0.5, 1.0), (1.0, 0.0)):
        trainer = Trainer(
            small_config(tmp_path / str(threshold), f"reward.correct_threshold={threshold}")
        )
        try:
            trainer.task.verify = lambda completion, row: 0.6  # type: ignore[method-assign]
            out = trainer.evaluate(samples=2)
        finally:
            trainer.close()
        assert out["eval/reward"] == pytest.approx(0.6)
        for key in ("eval/accuracy", "eval/pass@1", "eval/pass@2", "eval/avg@2"):
            assert out[key] == expected, key
        assert all(out[k] == expected for k in out if k.endswith("/accuracy"))


def test_grouped_scores_take_the_threshold() -> None:
    task = get_task("arithmetic", train_size=10, eval_size=10)
    rows = [{"level": 1}, {"level": 1}]
    assert (
        grouped_scores(task, rows, [0.99, 0.5], correct_threshold=0.99)["eval/level_1/accuracy"]
        == 0.5
    )
    assert (
        grouped_scores(task, rows, [0.99, 0.5], correct_threshold=0.4)["eval/level_1/accuracy"]
        == 1.0
    )


def test_docpo_threshold_is_set_in_one_place() -> None:
    """The docpo preset alone sets DocPO's 0.99; the recipe does not repeat it."""
    from policyopt.methods.presets import PRESETS
    from policyopt.recipes import recipe_dict

    assert "correct_threshold" not in recipe_dict("docpo").get("reward", {})
    assert PRESETS.get("docpo")["reward"]["correct_threshold"] == 0.99


def test_response_shape_medians_and_distinct_correct_answers() -> None:
    from functools import partial

    import torch

    from policyopt.methods.hispo import build_segments, segments_per_response
    from policyopt.rollout.base import Rollouts
    from policyopt.train.held_out import distinct_correct, response_shape

    g = torch.Generator().manual_seed(0)
    n, r = 3, 40
    mask = torch.zeros(n, r)
    for i, length in enumerate((40, 10, 25)):
        mask[i, :length] = 1
    entropy = torch.rand(n, r, generator=g) * mask
    rollouts = Rollouts(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        response_ids=torch.zeros(n, r, dtype=torch.long),
        response_mask=mask,
        logp=torch.zeros(n, r),
        entropies=entropy,
        truncated=torch.zeros(n, dtype=torch.bool),
        generated_tokens=75,
    )
    summary = ("segments_per_response", partial(segments_per_response, window=4))
    out = response_shape([rollouts], [summary])
    assert out["eval/response_tokens_median"] == 25.0
    ids = build_segments(entropy, mask, window=4)
    counts = sorted(int(ids[i, :length].max()) + 1 for i, length in enumerate((40, 10, 25)))
    assert out["eval/segments_per_response_median"] == counts[1] and counts[-1] > 1
    task = get_task("countdown", train_size=10, eval_size=5)
    texts = ["A:(7*4)-9", "A:7*4-9", "A: (7*4)-9", "A:(7+4)+9"]
    assert distinct_correct(task, texts, [True, True, True, False]) == 2


def test_every_annotator_that_declares_a_summary_is_reported_with_the_runs_options() -> None:
    """Evaluation names no method: an annotator's `eval_summary` is what it reports, with the
    run's options for that annotator (else its own defaults)."""
    from policyopt.config.load import load_config
    from policyopt.train.parts import response_summaries

    plain = dict(response_summaries(load_config()))
    assert list(plain) == ["segments_per_response"]
    assert plain["segments_per_response"].keywords == {}
    hispo = load_config(
        overrides=[
            "algorithm.name=hispo",
            "rollout.annotators=[{name: hispo_segments, options: {window: 8}}]",
        ]
    )
    assert dict(response_summaries(hispo))["segments_per_response"].keywords == {"window": 8}
