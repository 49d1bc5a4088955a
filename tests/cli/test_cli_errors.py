"""User mistakes at the command line: a clear one-paragraph message and exit code 2, never a
traceback; and `train` takes the same YAML files (`base:` included) as `quickstart`."""

import pytest
import yaml

from policyopt.cli.main import main


def run_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit code 2 and return what it printed on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith(f"policyopt {argv[0]}: error: ")
    assert "\n\n" not in err.strip()  # one paragraph
    return err


@pytest.mark.parametrize("command", ["train", "quickstart", "sft", "eval"])
def test_malformed_yaml_names_file_line_and_column(tmp_path, capsys, command) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  lr: 0.001\nrollout:\n  group_size: [4, 5\n  max_new_tokens: 12\n")
    argv = {
        "train": ["train", str(path)],
        "quickstart": ["quickstart", str(path)],
        "sft": ["sft", "--config", str(path), "--output-dir", str(tmp_path / "o")],
        "eval": ["eval", "--config", str(path), "--model", "tiny"],
    }[command]
    err = run_error(capsys, argv)
    # The flow sequence opened on line 4, column 15 is broken at line 5, column 17.
    assert f"{path}:5:17:" in err and "YAML" in err and "line 4, column 15" in err


def test_yaml_with_a_list_at_the_top_is_named(tmp_path, capsys) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- optim\n- rollout\n")
    err = run_error(capsys, ["train", str(path)])
    assert str(path) in err and "mapping" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "algorithm=grpo"], "did you mean 'algorithm.name=grpo'"),
        (["quickstart", "algorithm=dapo"], "did you mean 'algorithm.name=dapo'"),
        (["train", "optim=0.1"], "'optim' is a section"),
    ],
)
def test_a_value_where_a_section_is_expected_says_so(capsys, argv, expected) -> None:
    err = run_error(capsys, argv)
    assert expected in err and "section" in err


def test_a_scalar_section_in_a_yaml_file_says_so(tmp_path, capsys) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("rollout: 4\n")
    err = run_error(capsys, ["train", str(path)])
    assert "'rollout' is a section" in err


def test_a_bad_override_value_is_named(capsys) -> None:
    err = run_error(capsys, ["train", "task.options={train_size: [1}"])
    assert "task.options" in err and "YAML" in err


def test_unknown_key_in_a_list_entry_names_the_nearest(capsys) -> None:
    err = run_error(capsys, ["train", "reward.functions=[{nme: format}]"])
    assert "reward.functions.0.nme" in err and "did you mean 'reward.functions.0.name'" in err


def test_missing_config_file_and_unknown_recipe(tmp_path, capsys) -> None:
    err = run_error(capsys, ["train", str(tmp_path / "nope.yaml")])
    assert "nope.yaml" in err and "does not exist" in err
    err = run_error(capsys, ["quickstart", "grop"])
    assert "did you mean 'grpo'" in err or "grpo" in err


def test_part_mistakes_reach_the_cli_before_any_model_loads(capsys) -> None:
    err = run_error(capsys, ["train", "rollout.strategy_options={k_max: 2}"])
    assert "rollout.strategy_options.k_max" in err and "takes no options" in err


def test_train_accepts_recipe_files_with_base(tmp_path, capsys) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("base: grpo\nalgorithm:\n  name: dapo\ntrain:\n  steps: 7\n")
    assert main(["train", str(path), "--print-config", "optim.lr=0.001"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["algorithm"]["name"] == "dapo" and config["algorithm"]["clip_high"] == 0.28
    assert config["train"]["steps"] == 7 and config["optim"]["lr"] == 0.001
    # The rest comes from the shipped grpo recipe (not the field defaults).
    assert config["task"]["options"]["terse_fraction"] == 0.5
    assert config["sft"]["steps"] == 1000


def test_base_may_be_a_file_next_to_the_recipe(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "parent.yaml").write_text("base: grpo\nrollout:\n  group_size: 6\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\ntrain:\n  steps: 3\n")
    monkeypatch.chdir(tmp_path.parent)  # a relative base resolves next to the file
    assert main(["train", str(tmp_path / "child.yaml"), "--print-config"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["rollout"]["group_size"] == 6 and config["train"]["steps"] == 3
    assert config["sft"]["steps"] == 1000


def test_a_base_cycle_is_an_error(tmp_path, capsys) -> None:
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    err = run_error(capsys, ["train", str(tmp_path / "a.yaml")])
    assert "cycle" in err and "a.yaml" in err


def test_a_run_stopped_by_nonfinite_updates_says_why(tmp_path, capsys, monkeypatch) -> None:
    from policyopt.train import update
    from run_configs import small_overrides

    original = update.apply_policy_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = original(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(update, "apply_policy_loss", nan_loss)
    argv = ["train", *small_overrides(tmp_path, steps=3), "optim.max_nonfinite_updates=1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "stopped at step 1" in err and "optim.max_nonfinite_updates=1" in err


def test_a_model_path_that_does_not_exist_is_named(tmp_path, capsys) -> None:
    missing = tmp_path / "no-model"
    err = run_error(capsys, ["eval", "--model", str(missing)])
    assert str(missing) in err and "does not exist" in err
    out = f"train.output_dir={tmp_path / 'run'}"
    err = run_error(capsys, ["train", f"model.name_or_path={missing}", out, "train.progress=false"])
    assert str(missing) in err and "does not exist" in err


def test_an_unknown_name_without_a_near_one_still_reads(capsys) -> None:
    err = run_error(capsys, ["compare", "zzzz", "--seeds", "1"])
    assert "unknown recipe 'zzzz'; valid names: " in err
