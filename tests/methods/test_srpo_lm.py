"""SRPO's language-model scenario: the tiny LM emits `[3] > [1] > [2] > [4]` rankings and
`algorithm.advantage=srpo` trains with distances between its parsed rankings."""

import json
import math

import pytest
import torch

from policyopt.config.load import load_config
from policyopt.pipelines.quickstart import warm_started_policy
from policyopt.recipes import recipe_dict
from policyopt.tasks import get_task
from policyopt.train.trainer import Trainer


def test_rerank_task_rows_and_reward():
    task = get_task("rerank", train_size=20, eval_size=5, seed=1)
    row = task.rows("train")[0]
    assert row["prompt"].startswith("Query: ") and row["prompt"].endswith("Rank:")
    assert task.verify(row["solution"], row) == pytest.approx(1.0)
    assert task.verify("I cannot rank these", row) is None
    assert 0 <= task.verify("[4] > [3] > [2] > [1]", row) <= 1
    shuffled = [task.sft_targets(r)[0] != r["solution"] for r in task.rows("train")]
    assert 0 < sum(shuffled) < len(shuffled)  # about half are random orders


@pytest.mark.slow
def test_srpo_advantage_trains_the_lm_reranker(tmp_path):
    # 10 SFT steps (batch 8, lr 0.01) are the fewest measured here that make the tiny LM
    # emit parseable, varied rankings; without SFT every completion is unparseable (reward 0
    # for all, so no advantage and no update), which is why SFT stays.
    overrides = [
        f"train.output_dir={tmp_path}",
        "task.options={train_size: 40, eval_size: 4}",
        "sft.steps=10",
        "sft.batch_size=8",
        "sft.lr=0.01",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "train.steps=2",
        "train.num_threads=1",
        "train.progress=false",
        "train.plot=false",
        "train.loggers=[jsonl]",
        "eval.size=4",
    ]
    config = load_config(None, overrides, base=recipe_dict("rerank_srpo"))
    assert config.algorithm.advantage == "srpo" and config.algorithm.loss == "ppo_clip"
    model, tok, _ = warm_started_policy(config, __import__("rich.console").console.Console())
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(config, model=model, tokenizer=tok)
    trainer.train()
    trainer.close()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert math.isfinite(r["advantage/abs_mean"]) and r["advantage/abs_mean"] > 0
        assert r["srpo/mean_distance"] > 0  # distances from the parsed rankings
        assert math.isfinite(r["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_rerank_parse_metrics_by_hand():
    from policyopt.envs.ltr.rerank import parse_metrics

    rows = [{"labels": [3.0, 0.0, 2.0, 1.0]}] * 4
    texts = [
        "[1] > [3] > [4] > [2]",  # the ideal ranking: NDCG 1
        "[2] > [2] > [4]",  # parsed (repeat skipped), incomplete
        "no ranking here",  # unparseable
        "[1] > [3] > [4] > [2] trailing",  # complete
    ]
    got = parse_metrics(texts, rows)
    assert got["eval/parse_rate"] == pytest.approx(0.75)
    assert got["eval/complete_rate"] == pytest.approx(0.5)
    partial = get_task("rerank", train_size=1, eval_size=1).verify("[2] > [4]", rows[0])
    assert 0 < partial < 1
    assert got["eval/ndcg_parsed"] == pytest.approx((1.0 + partial + 1.0) / 3)
    assert parse_metrics(["x"], rows[:1]) == {
        "eval/parse_rate": 0.0,
        "eval/complete_rate": 0.0,
        "eval/ndcg_parsed": 0.0,
    }


@pytest.mark.slow
def test_rerank_study_runs_both_methods_and_resumes(tmp_path):
    from studies.srpo.rerank_study import main

    out = tmp_path / "rerank.jsonl"
    args = [
        "--out",
        str(out),
        "--seeds",
        "0",
        "task.options={train_size: 40, eval_size: 4}",
        "sft.steps=10",
        "sft.batch_size=8",
        "sft.lr=0.01",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "train.steps=2",
        "eval.every=1",
        "eval.size=4",
    ]
    assert main(args) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["method"], r["seed"]) for r in rows] == [("srpo", 0), ("grpo", 0)]
    for r in rows:
        assert [p[0] for p in r["curve"]] == [0, 1, 2]
        assert 0 <= r["after"]["eval/parse_rate"] <= 1
        # eval/reward counts the unparseable as 0: parse rate x NDCG among the parsed
        for _, reward, parse, _, parsed in r["curve"]:
            assert reward == pytest.approx(parse * parsed, abs=1e-9)
    assert rows[0]["before"] == rows[1]["before"]  # one SFT model per seed
    # SRPO's advantage metrics are logged by the srpo run only.
    assert -1 <= rows[0]["srpo/corr_grpo_mean"] <= 1
    assert 0 <= rows[0]["srpo/saturation_mean"] <= 1
    assert rows[1]["srpo/corr_grpo_mean"] is None
    assert main(args) == 0  # both done: nothing runs again
    assert len(out.read_text().splitlines()) == 2
