"""Shipped recipes: each resolves to a valid config whose task builds."""

import pytest

from policyopt.config.load import load_config
from policyopt.recipes import recipe_dict, recipe_names
from policyopt.tasks.base import get_task


@pytest.mark.slow
@pytest.mark.parametrize("name", recipe_names())
def test_every_shipped_recipe_loads_and_builds_its_task(name: str) -> None:
    config = load_config(None, [], base=recipe_dict(name))
    options = {**config.task.options, "train_size": 8, "eval_size": 4}
    task = get_task(config.task.name, **options)
    assert len(task.rows("train")) == 8


def test_a_recipe_that_changes_the_task_drops_the_base_task_options() -> None:
    grpo, docpo = recipe_dict("grpo"), recipe_dict("docpo")
    assert docpo["task"]["name"] == "docparse" != grpo["task"]["name"]
    # grpo's terse_fraction is an arithmetic option: gone.
    assert set(docpo["task"]["options"]) == {"levels", "types", "ocr_text_fraction"}
    # A recipe on the same task keeps the base's options.
    assert recipe_dict("hispo")["task"] == grpo["task"]
