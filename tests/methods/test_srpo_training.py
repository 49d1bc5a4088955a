"""SRPO in the one training loop: the ranking policy, the distances shaper, the preset."""

import json
import math
import statistics

import pytest
import torch

from policyopt.config.load import load_config
from policyopt.core.rank_distance import kendall_distances
from policyopt.core.structure import MissingStructureError
from policyopt.methods.srpo import RankingDistances
from policyopt.recipes import recipe_dict
from policyopt.rewards.shaping import ShapingContext
from policyopt.rollout.base import Rollouts
from policyopt.train.batch import Batch
from policyopt.train.trainer import Trainer
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
    out, metrics = RankingDistances(weighting="uniform")(rewards, ctx)
    assert torch.equal(out, rewards)
    d = ctx.structure["distances"]
    # d(σ, reverse σ) with uniform weights: all 3 pairs of 3 items; with k = 2 only pairs
    # with an item in the top 2: also 3.
    assert ctx.structure["distance_scale"].tolist() == [3.0] * 5
    assert "distances" in ctx.rollouts.pairwise
    # Group 0: (0,1,2), (1,0,2) and the unparseable one as candidate order (0,1,2).
    want0 = kendall_distances(torch.tensor([[0, 1, 2], [1, 0, 2], [0, 1, 2]]), "uniform", False)
    assert torch.equal(d[:3, :3], want0)
    # Group 1: top-2 lists (2, 0) and (1, 0) of 3 candidates, cut at k = 2.
    want1 = kendall_distances(torch.tensor([[2, 0, 1], [1, 0, 2]]), "uniform", False, k=2)
    assert torch.equal(d[3:, 3:], want1)
    assert d[0, 3] == 0
    # Mean of the normalised within-group distances: group 0 pairs (0,1): 1, (0,2): 0,
    # (1,2): 1 -> 4/6 ordered; group 1: 2 ordered pairs of want1[0, 1]; all over 3.
    want_mean = (4 + 2 * float(want1[0, 1])) / 3 / 8
    assert metrics["srpo/mean_distance"] == pytest.approx(want_mean)


def test_shaper_option_normalize_moved():
    with pytest.raises(ValueError, match="advantage_options.normalize"):
        RankingDistances(normalize=True)


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
    if algo == "srpo":
        assert all(r["srpo/mean_distance"] > 0 for r in records)
        # The advantage's metrics reach metrics.jsonl every step.
        assert all(0 <= r["srpo/saturation"] <= 1 for r in records)
        assert all(-1 <= r["srpo/corr_grpo"] <= 1 for r in records)
    assert after["eval/ndcg@5"] > before + 0.1, (before, after)
    assert (tmp_path / "checkpoints").is_dir()


def test_pl_off_policy_epochs_minibatches_and_kl(tmp_path):
    """Two epochs of two minibatches with a KL to the initial policy: the second pass's
    ratio must differ from 1 (old log-probs are the behaviour policy's, computed once) and
    the KL must grow from 0 (the reference is the initial policy)."""
    base = recipe_dict("srpo")
    overrides = ranking_overrides(
        tmp_path,
        "train.steps=2",
        "optim.lr=0.05",
        "optim.warmup_steps=0",
        "algorithm.ppo_epochs=2",
        "algorithm.minibatches=2",
        "algorithm.kl_coef=0.1",
        "algorithm.kl_estimator=k1",
    )
    trainer = Trainer(load_config(None, overrides, base=base))
    batch = finished_batch(trainer, [0, 1, 2, 3])
    r = batch.rollouts
    # The sampler's log-probs are the policy's: the update's old log-probs start from them.
    ids = torch.cat([r.prompt_ids, r.response_ids], 1)
    mask = torch.cat([r.prompt_mask, r.response_mask.long()], 1)
    width = r.response_ids.shape[1]
    with torch.no_grad():
        before = trainer.model.response_logprobs(ids, mask, width).logp
    assert torch.allclose(before, r.logp, atol=1e-5)
    trainer.train()
    with torch.no_grad():
        after = trainer.model.response_logprobs(ids, mask, width).logp
    trainer.close()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = records[0]
    # Off-policy: 4 optimizer steps per batch, so passes 2-4 see ratios != 1.
    assert first["approx_kl"] > 1e-5, first
    assert first["ratio_max"] > 1.0 + 1e-3 or first["ratio_min"] < 1.0 - 1e-3, first
    # k1 to the initial policy: exactly 0 on the first minibatch, nonzero afterwards.
    assert abs(records[1]["kl_ref"]) > 1e-5, records[1]
    # The policy moved on the positions sampled before training (else nothing was learnt).
    moved = ((after - before).abs() * r.response_mask).max()
    assert moved > 1e-3


def brute_top_distance(a, b, k):
    """½ Σ_{pairs} |Φ(a) − Φ(b)|, Φ_xy = ±w(better position), w(p) = 1/log2(1 + p) for
    p <= k (1-based), else 0: the module docstring of core.rank_distance, as a loop."""
    pos_a = {item: p for p, item in enumerate(a, 1)}
    pos_b = {item: p for p, item in enumerate(b, 1)}

    def phi(pos, x, y):
        p = min(pos[x], pos[y])
        w = 1 / math.log2(1 + p) if p <= k else 0.0
        return w if pos[x] < pos[y] else -w

    items = sorted(a)
    return 0.5 * sum(
        abs(phi(pos_a, x, y) - phi(pos_b, x, y))
        for i, x in enumerate(items)
        for y in items[i + 1 :]
    )


def test_one_step_advantages_against_an_independent_computation(tmp_path):
    """One step's srpo advantages from the rollouts alone: rankings read from the response
    ids by a dictionary lookup, distances by the loop above, the normalisation and formula
    by hand (group_mean and reverse)."""
    for normalize in ("group_mean", "reverse"):
        cfg = load_config(
            None,
            ranking_overrides(
                tmp_path / normalize,
                "train.steps=1",
                f"algorithm.advantage_options={{normalize: {normalize}, temperature: 1.5}}",
            ),
            base=recipe_dict("srpo"),
        )
        trainer = Trainer(cfg)
        batch = finished_batch(trainer, [0, 1, 2, 3])
        metrics = batch.metrics
        r = batch.rollouts
        rankings = []
        for i in range(len(batch)):
            cand = [int(x) for x, m in zip(r.prompt_ids[i], r.prompt_mask[i], strict=True) if m]
            where = {item: j for j, item in enumerate(cand)}
            top = [
                where[int(x)]
                for x, m in zip(r.response_ids[i], r.response_mask[i], strict=True)
                if m
            ]
            rankings.append(top + [j for j in range(len(cand)) if j not in top])
        k = 5
        n = len(rankings[0])
        reverse = brute_top_distance(list(range(n)), list(range(n))[::-1], k)
        rewards = batch.rewards["total"].tolist()
        groups = batch.group_ids.tolist()
        want = []
        for i in range(len(batch)):
            members = [j for j in range(len(batch)) if groups[j] == groups[i]]
            vals = [rewards[j] for j in members]
            if len(set(vals)) == 1:
                want.append(0.0)
                continue
            sigma = statistics.stdev(vals)
            d = {
                (x, y): brute_top_distance(rankings[x], rankings[y], k)
                for x in members
                for y in members
                if x != y
            }
            scale = sum(d.values()) / len(d) if normalize == "group_mean" else reverse
            total = 0.0
            for j in members:
                if j != i and d[i, j] > 0:
                    s = (rewards[i] - rewards[j]) / (d[i, j] / scale + 1e-6)
                    total += math.tanh(s / (1.5 * sigma))
            want.append(total / (len(members) - 1))
        assert batch.advantages.tolist() == pytest.approx(want, abs=1e-4)
        assert "srpo/saturation" in metrics and "srpo/corr_grpo" in metrics
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


def test_lm_on_a_learning_to_rank_task_is_a_clear_error(tmp_path):
    from policyopt.config.load import ModelConfig
    from policyopt.tasks import TASKS
    from policyopt.train.policy import load_policy

    task = TASKS.get("ltr_synthetic")(train_size=4, eval_size=2, docs_per_query=5)
    with pytest.raises(ValueError, match="learning-to-rank task for a ranking policy"):
        load_policy(ModelConfig(name_or_path="tiny"), task)


def test_shaper_names_an_lm_on_item_rows():
    """Item-id rows with rollouts whose tokens are no candidates (an LM's characters): the
    shaper says what is wrong, not 'indices >= n'."""
    ctx = lm_context(["i2 i1", "i1 i2"], [0, 0], [[1.0, 0.0]] * 2)
    ctx.columns["items"] = [[7, 8], [7, 8]]
    ctx.rollouts.prompt_ids = torch.tensor([[7, 8], [7, 8]])
    ctx.rollouts.prompt_mask = torch.ones(2, 2, dtype=torch.long)
    ctx.rollouts.response_ids = torch.tensor([[105, 50], [105, 49]])  # 'i', '2' / 'i', '1'
    ctx.rollouts.response_mask = torch.ones(2, 2)
    with pytest.raises(ValueError, match="ranking policy"):
        RankingDistances()(torch.zeros(2), ctx)
