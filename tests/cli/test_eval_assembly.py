"""`policyopt eval` assembles a run as training does (`build_parts`, `load_policy`): a ranking
checkpoint evaluates, and the run's engine options reach the engine it samples with."""

from __future__ import annotations

import json

import pytest

from policyopt.cli.main import main


def ranking_run(out) -> list[str]:
    task = "{train_size: 40, eval_size: 8, docs_per_query: 12, num_features: 10}"
    return [
        "train",
        "srpo",
        f"train.output_dir={out}",
        "train.steps=1",
        "train.num_threads=1",
        "train.loggers=[jsonl]",
        "train.progress=false",
        "train.plot=false",
        f"task.options={task}",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "eval.every=0",
        "eval.size=4",
    ]


@pytest.mark.slow
def test_eval_of_a_ranking_checkpoint(tmp_path, capsys, monkeypatch):
    import policyopt.rollout.base as base

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "rank"
    assert main(ranking_run(run)) == 0
    capsys.readouterr()
    built = []
    real = base.ENGINES.get("pl")

    def spy(model, tokenizer=None, **options):  # noqa: ANN001, ANN202
        built.append(options)
        return real(model, tokenizer, **options)

    monkeypatch.setitem(base.ENGINES._entries, "pl", spy)
    argv = ["eval", "--model", str(run), "--json-out", str(tmp_path / "e.json")]
    assert main([*argv, "rollout.batch_size=3"]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    # The ranking policy was loaded as one (an LM loader fails on its folder), sampled by
    # the engine the run's config names with its settings, and scored by NDCG.
    assert built == [{"batch_size": 3}]
    assert 0.0 <= result["eval/reward"] <= 1.0
