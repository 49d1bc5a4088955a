"""Parts that compose (issue 13, items 1-5): GAR with other reward terms, group filters on
the shaped rewards, DocPO with DAPO's overlong penalty, per-loss clip defaults, the overlong
shaper. Each test combines the parts through the trainer's own code path."""

import math

import pytest
import torch

from policyopt.config.load import ConfigError, load_config
from policyopt.rewards import overlong_penalty
from policyopt.train.trainer import Trainer
from run_configs import finished_batch, shaped_round, small_overrides


def small(tmp_path, *extra, steps=1):
    return load_config(overrides=[*small_overrides(tmp_path, steps), *extra])


def digit_fraction(text):
    return sum(c.isdigit() for c in text) / max(len(text), 1)


# ------------------------------------------------------------------ item 1
def test_gar_replaces_only_the_task_term_other_weighted_functions_add(tmp_path):
    """reward.functions = [digit_fraction (the task term), char_count x 0.01]: GAR's reward
    replaces the first; the length bonus adds to it, for correct and wrong rollouts alike."""
    trainer = Trainer(
        small(
            tmp_path,
            "algorithm.name=gar",
            "reward.functions=[{name: 'rewards_for_tests:digit_fraction'}, "
            "{name: 'rewards_for_tests:char_count', weight: 0.01}]",
            "reward.correct_threshold=0.1",
        )
    )
    batch = finished_batch(trainer, [0, 1, 2, 3])
    trainer.close()
    bonus = torch.tensor([0.01 * len(c) for c in batch.completions])
    gar = batch.rewards["total"] - bonus
    correct = torch.tensor([digit_fraction(c) >= 0.1 for c in batch.completions])
    assert correct.any() and (~correct).any()
    assert torch.allclose(gar[~correct], torch.zeros(int((~correct).sum())), atol=1e-6)
    assert ((gar[correct] >= 1.0 - 1e-6) & (gar[correct] <= 1.5 + 1e-6)).all()


# ------------------------------------------------------------------ item 2
def test_gar_with_dynamic_sampling_keeps_all_correct_groups(tmp_path):
    """Every rollout is correct (the verifier gives 1 everywhere): the verifier's rewards are
    constant in every group, but GAR's bonus is not, and dynamic sampling must keep them."""
    trainer = Trainer(
        small(
            tmp_path,
            "algorithm.name=gar",
            "algorithm.dynamic_sampling=true",
            "algorithm.max_sampling_rounds=2",
            "reward.functions=[{name: 'rewards_for_tests:always_one'}]",
        )
    )
    metrics = trainer.run_step()
    trainer.close()
    assert "skipped_update" not in metrics
    assert metrics["filter/kept_groups"] == 2 and metrics["filter/rounds"] == 1
    assert metrics["gar/bonus_mean"] > 0


def test_dapo_filter_looks_at_the_task_reward_not_at_the_length_penalty(tmp_path):
    """DAPO drops groups whose accuracy is 0 or 1 (paper section 3.2), also when the overlong
    penalty makes their rewards differ: the filter sees the (shaped) task term only."""
    trainer = Trainer(
        small(
            tmp_path,
            "algorithm.name=dapo",
            "reward.functions=[{name: task}]",  # the untrained model is always wrong
            "reward.shapers=[{name: overlong, options: {max_len: 8, cache_len: 8}}]",
            "algorithm.max_sampling_rounds=2",
        )
    )
    scored = shaped_round(trainer, [0, 1])
    assert len(set(scored.rewards["total"].tolist())) > 1  # the penalty differs between rollouts
    metrics = trainer.run_step()
    trainer.close()
    assert metrics["filter/kept_groups"] == 0 and metrics["skipped_update"] == 1.0


def test_stateful_shaper_advances_once_per_step_over_sampling_rounds():
    """DocPO's controller observes every round of a step, but moves tau once per step, and
    every round of that step is shaped with the same gamma."""
    from policyopt.methods.docpo import DispersionController, StepAwareShaper

    def make():
        c = DispersionController(tau_init=100.0, rate=0.5, min_samples=2, window=64)
        return StepAwareShaper(controller=c)

    spread = torch.tensor([0.0, 1.0, 0.0, 1.0])  # CV = 1 > target: tau grows
    shaper = make()
    first, m1 = shaper.shape(spread, ["t"] * 4, step=3)
    second, m2 = shaper.shape(torch.tensor([0.5, 0.25, 0.5, 0.25]), ["t"] * 4, step=3)
    assert m1["docpo/t/tau"] == m2["docpo/t/tau"] == pytest.approx(100.0 * math.exp(0.5))
    assert m1["docpo/t/gamma"] == m2["docpo/t/gamma"]
    _, m3 = shaper.shape(spread, ["t"] * 4, step=4)  # the next step moves it again
    assert m3["docpo/t/tau"] == pytest.approx(100.0 * math.exp(1.0))
    assert len(shaper.controller.state_dict()["rewards"]["t"]) == 12  # all rounds observed
    # Resume: the step of the last move is part of the state.
    again = make()
    again.load_state_dict(shaper.state_dict())
    _, m4 = again.shape(spread, ["t"] * 4, step=4)
    assert m4["docpo/t/tau"] == m3["docpo/t/tau"]


# ------------------------------------------------------------------ item 3
def test_docpo_annealing_with_dapo_overlong_penalty(tmp_path):
    """The power transform applies to the task reward M in [0, 1]; the overlong penalty
    (outside [0, 1]) adds after it, whichever order the shapers are listed in."""
    for order in ("saa_first", "overlong_first"):
        saa = "{name: step_aware_annealing, options: {type_column: level}}"
        over = "{name: overlong, options: {max_len: 10, cache_len: 6}}"
        shapers = f"[{saa}, {over}]" if order == "saa_first" else f"[{over}, {saa}]"
        trainer = Trainer(small(tmp_path / order, f"reward.shapers={shapers}"))
        trainer.step = 40  # gamma well above 1
        batch = finished_batch(trainer, [0, 1, 2, 3])
        metrics = batch.metrics
        trainer.close()
        gammas = {k: v for k, v in metrics.items() if k.endswith("/gamma")}
        assert gammas and all(g > 2 for g in gammas.values())
        levels = [str(trainer.train_rows[i]["level"]) for i in range(4)]
        gamma = torch.tensor([metrics[f"docpo/{levels[i // 4]}/gamma"] for i in range(len(batch))])
        m = torch.tensor([digit_fraction(c) for c in batch.completions])
        expected = m**gamma + overlong_penalty(batch.rollouts.lengths, 10, 6)
        assert (overlong_penalty(batch.rollouts.lengths, 10, 6) < 0).any()
        torch.testing.assert_close(batch.rewards["total"], expected.float(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ item 4
def test_each_loss_carries_its_own_clip_defaults_and_user_values_win():
    from policyopt.config.check import loss_settings

    def clips(*overrides: str) -> tuple[float, float]:
        s = loss_settings(load_config(overrides=list(overrides)))
        return s["clip_low"], s["clip_high"]

    assert clips("algorithm.loss=gspo") == (3e-4, 4e-4)
    assert clips("algorithm.loss=hispo", "rollout.annotators=[{name: hispo_segments}]") == (
        0.2,
        0.2,
    )
    dapo = loss_settings(load_config(overrides=["algorithm.name=dapo"]))
    assert (dapo["clip_low"], dapo["clip_high"], dapo["agg"]) == (0.2, 0.28, "token-mean")
    assert clips("algorithm.name=dapo", "algorithm.loss=gspo") == (3e-4, 4e-4)
    assert clips("algorithm.loss=gspo", "algorithm.clip_high=1e-3") == (3e-4, 1e-3)
    assert clips("algorithm.name=gspo", "algorithm.loss=ppo_clip") == (0.2, 0.2)
    # The check reads the config and never writes it: what it resolved stays unset.
    assert load_config(overrides=["algorithm.loss=gspo"]).algorithm.clip_low is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.name=gspo", "algorithm.agg=token-mean"], r"algorithm.agg.*'gspo'"),
        (
            ["algorithm.name=hispo", "algorithm.agg=seq-mean-token-mean"],
            r"algorithm.agg.*'hispo'",
        ),
        (["algorithm.loss_options={clip_low: 0.1}"], r"algorithm.clip_low"),
    ],
)
def test_an_option_the_loss_ignores_is_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


# ------------------------------------------------------------------ item 5
def test_overlong_is_a_registered_shaper_with_the_paper_default_buffer(tmp_path):
    from policyopt.rewards.shaping import SHAPERS

    dapo = load_config(overrides=["algorithm.name=dapo"])
    assert [(s.name, s.options) for s in dapo.reward.shapers] == [("overlong", {})]
    with pytest.raises(ConfigError, match="reward.overlong"):
        load_config(overrides=["reward.overlong.enabled=true"])
    shaper = SHAPERS.get("overlong")(max_len=20480)
    assert shaper.cache_len == 4096  # DAPO: L_cache = 4096 of L_max = 20480, 0.2 L_max
    trainer = Trainer(small(tmp_path, "reward.shapers=[{name: overlong}]"))
    batch = finished_batch(trainer, [0, 1])
    trainer.close()
    # L_max defaults to rollout.max_new_tokens (12); L_cache = ceil(0.2 * 12) = 3.
    m = torch.tensor([digit_fraction(c) for c in batch.completions])
    torch.testing.assert_close(
        batch.rewards["total"], m + overlong_penalty(batch.rollouts.lengths, 12, 3)
    )


def test_overlong_filtering_masks_the_loss_of_truncated_responses(tmp_path):
    trainer = Trainer(small(tmp_path, "algorithm.filter_truncated=true"))
    batch = finished_batch(trainer, [0, 1, 2, 3])
    trainer.close()
    truncated = batch.rollouts.truncated
    assert truncated.any()
    assert (batch.loss_mask[truncated] == 0).all()
    kept = ~truncated
    assert torch.equal(batch.loss_mask[kept], batch.rollouts.response_mask[kept])


def test_task_function_names_the_term_shapers_transform(tmp_path):
    """reward.task_function picks M among the functions (default: 'task', else the first);
    correctness is judged on M alone, and a name that is not a function is a load error."""
    from policyopt.train.parts import task_function

    functions = (
        "reward.functions=[{name: 'rewards_for_tests:char_count', weight: 0.01}, "
        "{name: 'rewards_for_tests:digit_fraction'}]"
    )
    assert task_function(load_config(overrides=[functions])) == "rewards_for_tests:char_count"
    both = load_config(overrides=["reward.functions=[{name: arithmetic_format}, {name: task}]"])
    assert task_function(both) == "task"
    with pytest.raises(ConfigError, match="reward.task_function: 'digits' is not one of"):
        load_config(overrides=[functions, "reward.task_function=digits"])
    trainer = Trainer(
        small(
            tmp_path,
            "algorithm.name=gar",
            functions,
            "reward.task_function='rewards_for_tests:digit_fraction'",
            "reward.correct_threshold=0.1",
        )
    )
    batch = finished_batch(trainer, [0, 1, 2, 3])
    trainer.close()
    s = batch
    m = torch.tensor([digit_fraction(c) for c in batch.completions])
    assert torch.equal(s.correct, m >= 0.1)
    gar = batch.rewards["total"] - torch.tensor([0.01 * len(c) for c in batch.completions])
    assert torch.allclose(gar[~s.correct], torch.zeros(int((~s.correct).sum())), atol=1e-6)
    assert (gar[s.correct] >= 1.0 - 1e-6).all()
