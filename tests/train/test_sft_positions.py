"""Principles 5 and 3 for the SFT warm start: every example (prompt, demonstration, EOS) is
measured against the model's positions before the first step, and the quickstart's cached
warm start is keyed on the rows SFT trains on, by content."""

from __future__ import annotations

import json
import os

import pytest
import torch

from policyopt.config.load import load_config
from policyopt.models.loading import load_model
from policyopt.tasks import get_task
from policyopt.train import sft as sft_module
from policyopt.train.sft import run_sft
from sft_keys_for_tests import earlier_sft_cache_key

LIMIT = 512  # the embedded model's positions; its tokenizer is one token per character


def write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def sft_rows(prompt: int, solution: int) -> list[dict[str, str]]:
    """Four rows; row 2's prompt and solution have the given numbers of characters."""
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1), "solution": str(i + 1)} for i in range(4)]
    rows[2] = {"prompt": "p" * prompt, "answer": "1", "solution": "s" * solution}
    return rows


def file_task(path):
    return get_task("hf_dataset", path=str(path), eval_path=str(path), solution_column="solution")


@pytest.mark.parametrize(
    ("prompt", "solution"),
    [(700, 1), (4, 900), (LIMIT - 100, 100), (LIMIT - 400, 400)],  # the last two: 513
    ids=["long prompt", "long solution", "one over", "one over, solution"],
)
def test_sft_refuses_an_example_past_the_positions_before_its_first_step(
    tmp_path, monkeypatch, prompt, solution
) -> None:
    path = tmp_path / "long.jsonl"
    write_rows(path, sft_rows(prompt, solution))
    model, tok = load_model("tiny")

    def no_step(*args, **kwargs):
        raise AssertionError("SFT took a step")

    monkeypatch.setattr(sft_module, "sft_backward", no_step)
    cfg = load_config(overrides=["sft.steps=2"]).sft
    with pytest.raises(ValueError) as err:
        run_sft(model, tok, file_task(path), cfg, progress=False, data=f"task.options.path={path}")
    message = str(err.value)
    assert message.startswith("SFT: train row 2 (counting from 0) of task 'hf_dataset' (")
    assert str(path) in message and "\n" not in message
    need = prompt + solution + 1  # EOS
    assert f"{need} positions, more than the {LIMIT} of " in message


def test_an_example_exactly_at_the_positions_trains(tmp_path) -> None:
    path = tmp_path / "edge.jsonl"
    write_rows(path, sft_rows(LIMIT - 101, 100))  # 411 + 100 + EOS = 512
    model, tok = load_model("tiny")
    torch.manual_seed(0)
    cfg = load_config(overrides=["sft.steps=1", "sft.batch_size=4"]).sft
    assert run_sft(model, tok, file_task(path), cfg, progress=False)["sft/steps"] == 1.0


def test_environment_text_counts_towards_the_positions() -> None:
    """A demonstration's segments are all in the sequence, trained or not."""
    from types import SimpleNamespace

    from policyopt.models.loading import load_tokenizer
    from policyopt.train.sft import check_sft_positions

    class Segmented:
        name = "segmented"
        tools = ()

        def prompt_messages(self, row):
            return None

        def format_prompt(self, row):
            return row["prompt"]

        def sft_segments(self, row):
            return [[("call", True), ("r" * row["reply"], False), ("done", True)]]

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    tok = load_tokenizer("tiny")
    fits = {"prompt": "x" * 10, "reply": 64 - 10 - 8 - 1}  # call + done: 8, EOS: 1
    check_sft_positions(model, tok, Segmented(), [fits])
    with pytest.raises(ValueError, match=r"train row 1 .* 65 positions, more than the 64 "):
        check_sft_positions(model, tok, Segmented(), [fits, {**fits, "reply": fits["reply"] + 1}])


# ------------------------------------------------------------------- the SFT cache key
def quickstart_config(path):
    return load_config(
        overrides=[
            "task.name=hf_dataset",
            f"task.options={{path: '{path}', solution_column: solution, eval_fraction: 0.25}}",
            "sft.steps=2",
        ]
    )


def test_an_edited_solutions_file_is_another_warm_start(tmp_path) -> None:
    from policyopt.pipelines.quickstart import sft_cache_key

    path = tmp_path / "s.jsonl"
    rows = sft_rows(4, 1)
    write_rows(path, rows)
    before = sft_cache_key(quickstart_config(path))
    assert sft_cache_key(quickstart_config(path)) == before  # the same file, the same key
    stat = path.stat()
    for row in rows:  # the same size, and below the same modification time
        row["solution"] = "z"
    write_rows(path, rows)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    assert sft_cache_key(quickstart_config(path)) != before


def test_an_edited_eval_file_keeps_the_warm_start(tmp_path) -> None:
    """The key holds the rows SFT trains on, not every file the task reads."""
    from policyopt.pipelines.quickstart import sft_cache_key

    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    write_rows(train, sft_rows(4, 1))
    write_rows(held, sft_rows(4, 1))
    config = load_config(
        overrides=[
            "task.name=hf_dataset",
            f"task.options={{path: '{train}', eval_path: '{held}', solution_column: solution}}",
            "sft.steps=2",
        ]
    )
    before = sft_cache_key(config)
    write_rows(held, sft_rows(4, 2))
    assert sft_cache_key(config) == before
    write_rows(train, sft_rows(4, 2))
    assert sft_cache_key(config) != before


def _key_before_data(config) -> str:  # noqa: ANN001
    """sft_cache_key as it was before it read the data's content."""
    return earlier_sft_cache_key(config, segments=True)


def test_every_shipped_recipe_keeps_its_key(tmp_path) -> None:
    """The shipped recipes read no user file: their earlier warm starts stay valid."""
    from policyopt.pipelines.quickstart import sft_cache_key
    from policyopt.recipes import recipe_config, recipe_names

    for name in recipe_names():
        config = recipe_config(name, [], None, None)
        assert sft_cache_key(config) == _key_before_data(config), name
    # A file task's key is the old one plus its data.
    path = tmp_path / "s.jsonl"
    write_rows(path, sft_rows(4, 1))
    assert sft_cache_key(quickstart_config(path)) != _key_before_data(quickstart_config(path))
