"""Tasks declare what the CLI needs to know about them (no task-name branches in cli/)."""

from __future__ import annotations

import pytest

import policyopt.tasks  # noqa: F401  (registers the shipped tasks)
from policyopt.cli.commands import cannot_learn_warning
from policyopt.config.load import load_config
from policyopt.tasks.base import TASKS, task_class


@pytest.mark.parametrize(
    ("name", "random_start", "pipeline"),
    [
        ("arithmetic", False, "rl"),
        ("countdown", False, "rl"),
        ("docparse", False, "rl"),
        ("ltr_synthetic", True, "rl"),
        ("ltr_clicks", True, "rl"),
        ("ltr_diversity", True, "rl"),
        ("mslr", True, "rl"),
        ("rerank", True, "rl"),
        ("dmrl_skill", True, "dmrl"),
    ],
)
def test_declared_traits(name, random_start, pipeline):
    cls = task_class(name)
    assert cls.random_start is random_start and cls.pipeline == pipeline


def test_every_registered_task_is_a_class_with_traits():
    for name in TASKS:
        cls = task_class(name)
        assert isinstance(cls, type) and cls.pipeline in ("rl", "dmrl"), name


def test_untrained_model_warning_follows_the_declared_trait():
    assert cannot_learn_warning(load_config(None, [])) is not None  # arithmetic on 'tiny'
    ranking = load_config(None, ["task.name=ltr_clicks"])
    assert cannot_learn_warning(ranking) is None
