"""Reference rankers and the ranking quickstart's summary."""

import builtins
import json

import numpy as np
import pytest
import torch

from policyopt.cli.main import main
from policyopt.envs.ltr.baselines import lambdarank_ndcg, listwise_softmax_ndcg
from policyopt.tasks import get_task

SMALL = {"train_size": 40, "eval_size": 20, "docs_per_query": 12, "num_features": 10}


def random_ndcg(task, seed=0):
    rng = np.random.default_rng(seed)
    scores = [rng.normal(size=len(q.labels)) for q in task.queries["eval"]]
    return task.ranking_ndcg("eval", scores, 10)


def test_lambdarank_beats_random():
    pytest.importorskip("lightgbm")
    task = get_task("ltr_synthetic", **SMALL)
    got = lambdarank_ndcg(task, 10, trees=50)
    assert got is not None and got > random_ndcg(task) + 0.2
    # eval_size limits the held-out queries used.
    assert lambdarank_ndcg(task, 10, trees=50, eval_size=5) != got


@pytest.mark.slow
def test_tuned_lambdarank_picks_from_the_grid_by_validation():
    pytest.importorskip("lightgbm")
    from policyopt.envs.ltr.baselines import LAMBDARANK_GRID, lambdarank_tuned

    task = get_task("ltr_synthetic", **SMALL)
    got = lambdarank_tuned(task, 10)
    assert got["ndcg"] > random_ndcg(task) + 0.2
    for key, values in LAMBDARANK_GRID.items():
        assert got[key] in values
    assert 1 <= got["best_iteration"] <= 500  # early stopping on the validation queries
    assert 0 < got["valid_ndcg"] <= 1
    div = lambdarank_tuned(get_task("ltr_diversity", train_size=30, eval_size=10), 10)
    assert 0 < div["alpha_ndcg"] <= 1


def test_lambdarank_without_lightgbm_is_none(monkeypatch):
    real = builtins.__import__

    def no_lightgbm(name, *args, **kwargs):
        if name == "lightgbm":
            raise ImportError("no lightgbm")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_lightgbm)
    assert lambdarank_ndcg(get_task("ltr_synthetic", **SMALL)) is None


def test_listwise_softmax_beats_random():
    task = get_task("ltr_synthetic", **SMALL)
    # 15 Adam steps at lr 0.01 reach 0.84 here (random: 0.37); kept short for CI time.
    assert listwise_softmax_ndcg(task, 10, steps=15, lr=1e-2) > random_ndcg(task) + 0.2


def test_quickstart_srpo_writes_ranking_summary(tmp_path, capsys):
    out = tmp_path / "q"
    code = main(
        [
            "quickstart",
            "srpo",
            "--output-dir",
            str(out),
            f"task.options={json.dumps(SMALL)}",
            "train.steps=20",
            "train.progress=false",
            "train.plot=false",
            "train.loggers=[jsonl]",
            "eval.every=0",
            "rollout.prompts_per_step=4",
            "optim.lr=0.01",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("initial_ndcg@10", "final_ndcg@10", "oracle_ndcg@10", "lambdarank_ndcg@10"):
        assert key in summary
    assert summary["final_ndcg@10"] > summary["initial_ndcg@10"]
    assert 0 < summary["oracle_ndcg@10"] <= 1
    assert "held-out NDCG@10" in capsys.readouterr().out


def test_ranking_policy_init_depends_on_the_seed_only():
    """compare runs several pipelines in one process: each ranker starts from its seed."""
    import torch
    from rich.console import Console

    from policyopt.config.load import load_config
    from policyopt.pipelines.quickstart import warm_started_policy
    from policyopt.recipes import recipe_dict

    config = load_config(None, [f"task.options={json.dumps(SMALL)}"], base=recipe_dict("srpo"))
    first, _, _ = warm_started_policy(config, Console())
    torch.rand(100)  # an earlier run's use of the global RNG
    second, _, _ = warm_started_policy(config, Console())
    for k, v in first.state_dict().items():
        assert torch.equal(v, second.state_dict()[k]), k


def test_pg_rank_gradient_is_the_exact_expected_gradient():
    """PG-Rank's estimator (rloo advantages, clipped-ratio loss at ratio 1, Σ over positions)
    averaged over every pair of sampled rankings (G = 2, all 6 × 6 permutation pairs of 3
    items, weighted by their PL probabilities) equals ∇_s E_π[R] computed by enumeration."""
    import itertools

    from loss_helpers import policy_loss
    from policyopt.core import compute_advantages
    from policyopt.core.plackett_luce import plackett_luce_logprobs
    from policyopt.methods.presets import PRESETS

    preset = PRESETS.get("pg_rank")["algorithm"]
    scores = torch.tensor([[0.3, -0.5, 1.1]], dtype=torch.float64, requires_grad=True)
    perms = list(itertools.permutations(range(3)))
    reward = {p: 1.0 / (1 + p.index(2)) + 0.3 * (p[0] == 0) for p in perms}  # any R(π)
    logp = {p: plackett_luce_logprobs(scores, torch.tensor([p])).sum() for p in perms}
    exact = torch.autograd.grad(sum(logp[p].exp() * reward[p] for p in perms), scores)[0]
    expected = torch.zeros_like(scores)
    for a, b in itertools.product(perms, perms):
        lp = plackett_luce_logprobs(scores.expand(2, 3), torch.tensor([a, b]))
        adv = compute_advantages(
            preset["advantage"], torch.tensor([reward[a], reward[b]]), torch.tensor([0, 0])
        )
        loss, _ = policy_loss(
            preset["loss"],
            lp,
            lp.detach(),
            adv.double(),
            torch.ones(2, 3),
            agg=preset["agg"],
            clip_low=0.2,
            clip_high=0.2,
        )
        weight = float((logp[a] + logp[b]).detach().exp())
        expected -= weight * torch.autograd.grad(loss, scores)[0]
    assert torch.allclose(expected, exact, atol=1e-10), (expected, exact)
    assert exact.abs().max() > 0.01
