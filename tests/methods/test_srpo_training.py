"""SRPO in the one training loop: the ranking policy, the distances shaper, the preset."""

import json

import pytest
import torch

from policyopt.core import compute_advantages
from policyopt.core.rank_distance import kendall_distances
from policyopt.core.structure import MissingStructureError
from policyopt.methods.srpo import RankingDistances
from policyopt.recipes import recipe_dict
from policyopt.rewards.shaping import ShapingContext
from policyopt.rollout.base import Rollouts
from policyopt.trainer.batch import Batch
from policyopt.trainer.config import load_config
from policyopt.trainer.trainer import Trainer
from run_configs import finished_batch

TASK = "{train_size: 40, eval_size: 20, docs_per_query: 12, num_features: 10}"


def ranking_overrides(out, *extra):
    return [
        f"train.output_dir={out}",
        "train.num_threads=1",
        "train.loggers=[jsonl]",
        "train.progress=false",
        "train.plot=false",
        f"task.options={TASK}",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=5",
        "eval.every=0",
        *extra,
    ]


def lm_context(completions, group_ids, labels):
    n = len(completions)
    empty = torch.zeros(n, 1)
    rollouts = Rollouts(
        prompt_ids=empty.long(),
        prompt_mask=empty.long(),
        response_ids=empty.long(),
        response_mask=empty,
        logp=empty,
        entropies=empty,
        truncated=torch.zeros(n, dtype=torch.bool),
        generated_tokens=n,
    )
    round_ = Batch(
        rollouts=rollouts,
        group_ids=torch.tensor(group_ids),
        prompts=[""] * n,
        completions=completions,
        columns={"labels": labels},
        correct=torch.zeros(n, dtype=torch.bool),
    )
    return ShapingContext(round_, step=0, total_steps=1)


def test_distances_shaper_on_parsed_rankings():
    completions = ["[1] > [2] > [3]", "[2] > [1] > [3]", "garbage", "[3] > [1]", "[2] > [1]"]
    ctx = lm_context(completions, [0, 0, 0, 1, 1], [[1, 0, 2]] * 3 + [[0, 1, 0]] * 2)
    rewards = torch.arange(5.0)
    out, metrics = RankingDistances(weighting="uniform", normalize=False)(rewards, ctx)
    assert torch.equal(out, rewards)
    d = ctx.structure["distances"]
    assert "distances" in ctx.rollouts.pairwise
    # Group 0: (0,1,2), (1,0,2) and the unparseable one as candidate order (0,1,2).
    want0 = kendall_distances(torch.tensor([[0, 1, 2], [1, 0, 2], [0, 1, 2]]), "uniform", False)
    assert torch.equal(d[:3, :3], want0)
    # Group 1: top-2 lists (2, 0) and (1, 0) of 3 candidates, cut at k = 2.
    want1 = kendall_distances(torch.tensor([[2, 0, 1], [1, 0, 2]]), "uniform", False, k=2)
    assert torch.equal(d[3:, 3:], want1)
    assert d[0, 3] == 0 and metrics["srpo/mean_distance"] > 0


def test_srpo_without_distances_is_a_config_error(tmp_path):
    with pytest.raises(Exception, match="distances") as info:
        load_config(None, [f"train.output_dir={tmp_path}", "algorithm.advantage=srpo"])
    assert isinstance(info.value, MissingStructureError) or "ranking_distances" in str(info.value)


@pytest.mark.parametrize("algo", ["srpo", "grpo"])
def test_pl_policy_trains_in_the_loop(tmp_path, algo):
    base = recipe_dict("srpo")
    overrides = ranking_overrides(
        tmp_path, f"algorithm.name={algo}", "train.steps=30", "optim.lr=0.01"
    )
    if algo == "grpo":
        overrides.append("reward.shapers=[]")
    trainer = Trainer(load_config(None, overrides, base=base))
    before = trainer.evaluate()["eval/ndcg@5"]
    trainer.train()
    after = trainer.evaluate()
    trainer.close()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["advantage/abs_mean"] > 0 for r in records)
    assert all(abs(r["approx_kl"]) < 1e-5 for r in records)  # on-policy: ratio exactly 1
    if algo == "srpo":
        assert all(r["srpo/mean_distance"] > 0 for r in records)
    assert after["eval/ndcg@5"] > before + 0.1, (before, after)
    assert (tmp_path / "checkpoints").is_dir()


def test_srpo_advantage_from_shaper_matches_direct_computation(tmp_path):
    """One step's advantages are srpo of its rewards and the shaper's distances."""
    cfg = load_config(None, ranking_overrides(tmp_path, "train.steps=1"), base=recipe_dict("srpo"))
    trainer = Trainer(cfg)
    batch = finished_batch(trainer, [0, 1, 2, 3])
    scored = batch
    d = scored.rollouts.structure["distances"]
    want = compute_advantages("srpo", batch.rewards["total"], batch.group_ids, distances=d)
    assert torch.equal(batch.advantages, want)
    trainer.close()


def test_resume_ranking_checkpoint(tmp_path):
    base = recipe_dict("srpo")
    first = Trainer(load_config(None, ranking_overrides(tmp_path, "train.steps=2"), base=base))
    first.train()
    first.close()
    again = Trainer(load_config(None, ranking_overrides(tmp_path, "train.steps=2"), base=base))
    assert again.step == 2
    for k, v in first.model.state_dict().items():
        assert torch.equal(v, again.model.state_dict()[k])
    again.close()
