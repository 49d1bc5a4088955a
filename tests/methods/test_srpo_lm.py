"""SRPO's language-model scenario: the tiny LM emits `[3] > [1] > [2] > [4]` rankings and
`algorithm.advantage=srpo` trains with distances between its parsed rankings."""

import json
import math

import pytest
import torch

from policyopt.recipes import recipe_dict
from policyopt.recipes.pipeline import warm_started_policy
from policyopt.tasks import get_task
from policyopt.trainer.config import load_config
from policyopt.trainer.trainer import Trainer


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
