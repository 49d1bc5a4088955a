"""Declared structure of a configured run: who produces what, checked before anything runs.

Parts declare what they hand on and what they take (`policyopt.core.structure`). A step
produces structure in this order: the rollout strategy, the annotators, the reward functions,
then each shaper in turn; the advantage estimator and the policy loss read what is there at
the end. `check_config_structure` walks a config in that order and raises a
`MissingStructureError` for a part whose required input no earlier configured part
produces, naming the registered parts that would. At run time the step checks each producer's
values (`check_produced`, `check_declared_made` in core), so that a producer that did not
deliver is caught too, and `gather` hands each consumer its inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policyopt.core.structure import (
    BUILTIN,
    MissingStructureError,
    missing_message,
    needs_of,
    produces_of,
)

if TYPE_CHECKING:
    from policyopt.config.schema import Config


def configured_parts(config: Config) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(producers in the order they run, consumers) of a config, each as (label, part).

    Shapers are both: they appear in the producer list at their place in the order, and a
    shaper's needs are checked against what runs before it."""
    from policyopt.core import ADVANTAGES, POLICY_LOSSES
    from policyopt.rewards.functions import load_reward_function
    from policyopt.rewards.shaping import SHAPERS
    from policyopt.rollout.strategies import ROLLOUT_ANNOTATORS, ROLLOUT_STRATEGIES

    strategy = config.rollout.strategy
    producers = [(f"rollout strategy {strategy!r}", ROLLOUT_STRATEGIES.get(strategy))]
    producers += [
        (f"rollout annotator {a.name!r}", ROLLOUT_ANNOTATORS.get(a.name))
        for a in config.rollout.annotators
    ]
    producers += [
        (f"reward function {f.name!r}", load_reward_function(f.name))
        for f in config.reward.functions
        if f.name != "task"
    ]
    producers += [(f"reward shaper {s.name!r}", SHAPERS.get(s.name)) for s in config.reward.shapers]
    alg = config.algorithm
    consumers = [
        (f"advantage estimator {alg.advantage!r}", ADVANTAGES.get(alg.advantage)),
        (f"policy loss {alg.loss!r}", POLICY_LOSSES.get(alg.loss)),
    ]
    return producers, consumers


def check_config_structure(config: Config) -> None:
    """Every required input of a configured part is produced by a part that runs earlier.
    (A structure name given as an option is reported by `config_parts`.)"""
    producers, consumers = configured_parts(config)
    made = set(BUILTIN)
    for label, part in producers:
        _check_needs(label, part, made)  # a shaper's needs come from the parts before it
        made.update(produces_of(part))
    for label, part in consumers:
        _check_needs(label, part, made)


def _check_needs(label: str, part: Any, made: set[str]) -> None:
    for name in needs_of(part):
        if name not in made:
            raise MissingStructureError(missing_message(label, name, "this config"))
