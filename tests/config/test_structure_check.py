"""Declared structure through the trainer: producers reach consumers by declared name, and a
missing producer is an error that names it, at config load and at run time."""

import pytest
import torch

from policyopt.config.load import ConfigError, load_config
from policyopt.core import ADVANTAGES
from policyopt.core.advantages import grpo_advantages
from policyopt.core.structure import MissingStructureError, needs
from policyopt.train.trainer import Trainer


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.name=hispo", "rollout.annotators=[]"],
            r"policy loss 'hispo' needs 'segment_ids'.*rollout annotator 'hispo_segments'",
        ),
        (
            ["algorithm.advantage=datpo"],
            r"advantage estimator 'datpo' needs 'block_ids'.*rollout strategy 'datpo_tree'",
        ),
        (
            ["algorithm.name=datpo", "rollout.strategy=parallel", "rollout.strategy_options={}"],
            r"reward shaper 'datpo_diversity' needs 'block_ids'.*rollout strategy 'datpo_tree'",
        ),
        (
            ["algorithm.name=datpo", "algorithm.advantage_options={diversity_bonus: 1}"],
            r"advantage estimator 'datpo'.*diversity_bonus.*not an option",
        ),
    ],
)
def test_missing_producer_is_a_config_error_naming_it(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_presets_with_structure_load():
    for name in ("hispo", "datpo"):
        load_config(overrides=[f"algorithm.name={name}"])


def test_trainer_checks_a_config_built_in_code_before_loading_a_model(tmp_path, small_config):
    config = small_config(tmp_path, "algorithm.name=hispo")
    config.rollout.annotators = []  # no producer of segment_ids any more
    with pytest.raises(MissingStructureError, match="hispo_segments"):
        Trainer(config, model=None)


def test_reward_function_structure_reaches_the_advantage_estimator(
    tmp_path, small_config, monkeypatch
):
    """`rewards_for_tests:digit_fraction_with_structure` returns a per-rollout and a
    pairwise value; an estimator that declares it needs them receives them, after the
    rollout phase's filtering, aligned with the batch's completions."""
    seen = {}

    @needs("digit_count", "same_length")
    def estimator(rewards, group_ids, *, digit_count, same_length):
        seen.update(digit_count=digit_count, same_length=same_length)
        return grpo_advantages(rewards, group_ids)

    monkeypatch.setitem(ADVANTAGES._entries, "needs_digits", estimator)
    reward = "reward.functions=[{name: 'rewards_for_tests:digit_fraction_with_structure'}]"
    trainer = Trainer(
        small_config(
            tmp_path, reward, "algorithm.advantage=needs_digits", "algorithm.name=dapo", steps=1
        )
    )
    from policyopt.train.step import train_step

    # The production step: rollout, score, shape, the dynamic-sampling filter, advantage.
    scored, _ = train_step(trainer.parts, trainer.state)
    assert scored is not None
    trainer.close()
    counts = [sum(ch.isdigit() for ch in c) for c in scored.completions]
    assert seen["digit_count"].tolist() == counts
    lengths = [len(c) for c in scored.completions]
    expected = [[float(a == b) for b in lengths] for a in lengths]
    same = seen["same_length"]
    group = scored.group_ids
    within = group[:, None] == group[None, :]  # only entries within a group are defined
    assert same.shape == (len(lengths), len(lengths))
    assert torch.equal(same[within], torch.tensor(expected)[within])


def test_a_producer_that_does_not_deliver_is_caught_at_run_time(tmp_path, small_config):
    import policyopt.methods  # noqa: F401  (registers hispo_segments)
    from policyopt.rollout.strategies import ROLLOUT_ANNOTATORS

    annotator = ROLLOUT_ANNOTATORS.get("hispo_segments")
    trainer = None
    try:
        ROLLOUT_ANNOTATORS._entries["hispo_segments"] = type(
            "Broken", (), {"produces": annotator.produces, "__call__": lambda self, r: {}}
        )()
        # The parts are bound when the trainer is built, and checked statically then; the
        # annotator's empty output is caught when it runs.
        trainer = Trainer(small_config(tmp_path, "algorithm.name=hispo", steps=1))
        with pytest.raises(ValueError, match=r"declares it produces \['segment_ids'\]"):
            trainer.run_step()
    finally:
        ROLLOUT_ANNOTATORS._entries["hispo_segments"] = annotator
        if trainer is not None:
            trainer.close()
