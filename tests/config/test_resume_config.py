"""`train.resume: auto` into a folder trained with another config stops and names the keys,
unless `train.resume_anyway=true`; the saved config is kept until that check passes
(issue 13, item 11)."""

import shutil

import pytest
import yaml

from policyopt.cli.main import main
from policyopt.train.trainer import Trainer
from run_configs import small_overrides


def run(config) -> Trainer:
    trainer = Trainer(config)
    trainer.train()
    trainer.close()
    return trainer


def saved_lr(output_dir) -> float:
    return yaml.safe_load((output_dir / "config.yaml").read_text())["optim"]["lr"]


def test_changed_config_stops_resume_naming_the_keys(tmp_path, small_config) -> None:
    run(small_config(tmp_path, steps=2))
    before = (tmp_path / "config.yaml").read_text()
    changed = small_config(
        tmp_path,
        "optim.lr=0.002",
        "rollout.group_size=2",
        "train.num_threads=2",  # harmless: not named
        steps=5,  # harmless: not named
    )
    with pytest.raises(ValueError) as err:
        Trainer(changed)
    message = str(err.value)
    assert "optim.lr (saved 0.001, now 0.002)" in message
    assert "rollout.group_size (saved 4, now 2)" in message
    assert "train.steps" not in message and "train.num_threads" not in message
    assert message.count("(saved") == 2  # nothing else
    assert "train.resume_anyway=true" in message
    assert (tmp_path / "config.yaml").read_text() == before  # not overwritten by the attempt


def test_changed_config_from_the_command_line_is_a_one_line_error(
    tmp_path, small_config, capsys
) -> None:
    run(small_config(tmp_path, steps=1))
    assert main(["train", *small_overrides(tmp_path, 2), "algorithm.name=dapo"]) == 2
    err = capsys.readouterr().err
    assert "differs from the one" in err and "algorithm.name" in err and "Traceback" not in err


def test_resume_anyway_continues_with_the_new_config(tmp_path, small_config) -> None:
    run(small_config(tmp_path, steps=2))
    resumed = Trainer(small_config(tmp_path, "optim.lr=0.002", "train.resume_anyway=true", steps=3))
    assert resumed.step == 2
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.002)
    assert saved_lr(tmp_path) == 0.002  # the folder now describes the run that continues
    resumed.train()
    assert resumed.step == 3
    # The next resume compares against the new config (no flag needed any more).
    assert Trainer(small_config(tmp_path, "optim.lr=0.002", steps=3)).step == 3


def test_harmless_changes_resume(tmp_path, small_config) -> None:
    run(small_config(tmp_path / "a", steps=2))
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # train.output_dir differs too
    resumed = Trainer(
        small_config(
            tmp_path / "b",
            "train.num_threads=2",
            "train.progress=true",
            "train.save_every=1",
            "train.keep_last=4",
            "train.log_samples=0",
            "train.plot=true",
            "train.loggers=[jsonl, tensorboard]",
            "train.micro_batch_size=3",
            "model.logit_chunk_size=7",
            "rollout.batch_size=5",
            steps=3,
        )
    )
    assert resumed.step == 2


def test_changed_keys_by_hand() -> None:
    """Nested options compare key by key; resource knobs and run length are not named."""
    from policyopt.config.load import load_config
    from policyopt.config.resume_check import ABSENT, changed_keys

    saved = load_config(overrides=["task.options={train_size: 200}", "optim.max_grad_norm=null"])
    new = load_config(
        overrides=[
            "task.options={train_size: 300, eval_size: 20}",
            "optim.max_grad_norm=1.0",
            "train.steps=7",
            "train.output_dir=elsewhere",
            "rollout.batch_size=3",
        ]
    )
    assert changed_keys(saved, new) == [
        ("optim.max_grad_norm", None, 1.0),
        ("task.options.eval_size", ABSENT, 20),
        ("task.options.train_size", 200, 300),
    ]
    assert changed_keys(saved, saved) == []
