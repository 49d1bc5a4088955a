"""Principles every command keeps (issue 41), each tested over its class of cases:

1. nothing runs that the user did not ask to run: code a run folder's config names is not
   imported by `eval` without --allow-run-code; models load with trust_remote_code explicit;
2. nothing the user owns is overwritten, and a run folder belongs to one live run;
6. a failure the user can act on is one line: a file as output folder, a full disk;
7. evaluation says what it evaluates and refuses what is not whole.
"""

import errno
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from policyopt.cli.main import main
from policyopt.config.load import dump_config, load_config
from policyopt.models.tiny import tiny_model_path
from policyopt.store import checkpoint as ckpt
from policyopt.store import run_folder
from run_configs import small_overrides

# A module that leaves a file behind when imported: proof that its code ran.
SENTINEL_MODULE = textwrap.dedent(
    """
    from pathlib import Path
    Path(__file__).with_name("IMPORTED").write_text("ran")

    def score(prompts, completions, **kwargs):
        return [0.0 for _ in completions]
    """
)


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """A fresh working folder (on sys.path, as main puts it); sys.path restored and the
    test's module forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("shipped_rewards", None)  # each test's module imports afresh, or not
    yield tmp_path
    sys.modules.pop("shipped_rewards", None)


def one_line_error(capsys, argv: list[str], code: int = 2) -> str:
    """The command's error: exit `code`, one line, no traceback (after the warning that
    `train` gives these small runs of the untrained model)."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    head = f"policyopt {argv[0]}: "
    assert head in err, err
    tail = err[err.index(head) :].strip()
    assert "\n" not in tail, err
    return tail


def fake_run(folder: Path, steps: tuple[int, ...], **config_values) -> Path:
    """A run folder with complete checkpoints at `steps` (the embedded model's files, no
    training) and the saved config with `config_values` (dotted key -> YAML value)."""
    # Edited as YAML, not loaded: loading a config that names a module imports it.
    raw = yaml.safe_load(dump_config(load_config()))
    for key, value in config_values.items():
        node = raw
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = yaml.safe_load(value)
    text = yaml.safe_dump(raw)
    for step in steps:
        target = ckpt.checkpoint_root(folder) / f"{ckpt.PREFIX}{step:08d}"
        shutil.copytree(tiny_model_path(), target)
        (target / ckpt.CONFIG_FILE).write_text(text)
        ckpt.mark_complete(target, step)
    (folder / run_folder.MARKER).write_text("{}")
    return folder


# ----------------------------------------------------------------- 1. code from a run folder
# Every place a config can name code to run, as a run's saved config would hold it.
RUN_CODE = {
    "reward function": {"reward.functions": "[{name: 'shipped_rewards:score'}]"},
    "task reward function": {
        "task.name": "hf_dataset",
        "task.options": "{path: data.jsonl, reward_function: 'shipped_rewards:score'}",
    },
    "remote modelling code": {"model.trust_remote_code": "true"},
}


@pytest.mark.parametrize("place", list(RUN_CODE))
@pytest.mark.parametrize("given", ["run folder", "checkpoint folder"])
def test_eval_never_runs_code_a_run_folder_names(cwd, capsys, place, given) -> None:
    (cwd / "shipped_rewards.py").write_text(SENTINEL_MODULE)  # shipped inside the run
    (cwd / "data.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    run = fake_run(cwd / "run", (1,), **RUN_CODE[place])
    model = run if given == "run folder" else ckpt.latest_checkpoint(run)
    line = one_line_error(capsys, ["eval", "--model", str(model)])
    assert "--allow-run-code" in line and "someone else" in line
    what = "trust_remote_code" if place == "remote modelling code" else "'shipped_rewards'"
    assert what in line
    assert not (cwd / "IMPORTED").exists()


def test_allow_run_code_obeys_the_run_config(cwd, capsys) -> None:
    (cwd / "shipped_rewards.py").write_text(SENTINEL_MODULE)
    run = fake_run(cwd / "run", (1,), **RUN_CODE["reward function"])
    assert main(["eval", "--model", str(run), "--allow-run-code", "--print-config"]) == 0
    assert (cwd / "IMPORTED").exists()
    assert "shipped_rewards:score" in capsys.readouterr().out


def test_the_users_own_choices_need_no_flag(cwd, capsys) -> None:
    """An override replacing the run's reward, or the user's own config file naming a module
    (their own code), is obeyed as given."""
    (cwd / "shipped_rewards.py").write_text(SENTINEL_MODULE)
    run = fake_run(cwd / "run", (1,), **RUN_CODE["reward function"])
    argv = ["eval", "--model", str(run), "--print-config", "reward.functions=[{name: task}]"]
    assert main(argv) == 0
    assert not (cwd / "IMPORTED").exists()
    (cwd / "mine.yaml").write_text("reward:\n  functions: [{name: 'shipped_rewards:score'}]\n")
    assert main(["eval", "mine.yaml", "--model", str(run), "--print-config"]) == 0
    assert (cwd / "IMPORTED").exists()


def test_a_run_this_user_wrote_needs_no_flag(cwd, capsys, monkeypatch) -> None:
    """A checkpoint's config signed with this user's key (as finish_checkpoint signs it) is
    obeyed; edited afterwards, or signed with another user's key, it is not."""
    from policyopt.store import provenance

    monkeypatch.setenv("POLICYOPT_CACHE", str(cwd / "cache-mine"))
    (cwd / "shipped_rewards.py").write_text(SENTINEL_MODULE)
    run = fake_run(cwd / "run", (1,), **RUN_CODE["reward function"])
    config = ckpt.latest_checkpoint(run) / ckpt.CONFIG_FILE
    provenance.sign(config)
    assert main(["eval", "--model", str(run), "--print-config"]) == 0
    assert (cwd / "IMPORTED").exists()
    capsys.readouterr()
    # Edited after it was signed (the same size: the checkpoint stays complete).
    config.write_text(config.read_text().replace("grpo", "gspo", 1))
    assert "--allow-run-code" in one_line_error(capsys, ["eval", "--model", str(run)])
    provenance.sign(config)
    monkeypatch.setenv("POLICYOPT_CACHE", str(cwd / "cache-theirs"))  # another user's key
    assert "--allow-run-code" in one_line_error(capsys, ["eval", "--model", str(run)])


def test_every_completed_checkpoint_config_is_signed(tmp_path, monkeypatch) -> None:
    from policyopt.store import provenance

    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))

    def write(folder: Path) -> None:
        (folder / ckpt.CONFIG_FILE).write_text("train: {}\n")

    done = ckpt.commit_checkpoint(tmp_path / "run", 1, write, keep_last=2)
    assert provenance.signed_here(done / ckpt.CONFIG_FILE) and ckpt.is_complete(done)


def test_every_module_spec_anywhere_in_a_config_is_found() -> None:
    from policyopt.cli.commands import run_config_code

    raw = {
        "reward": {"functions": [{"name": "task"}, {"name": "pkg.mod:fn"}]},
        "task": {"options": {"deep": {"list": ["x", "other:thing"]}, "template": "A: {prompt}"}},
        "rollout": {"strategy": "policyopt.rollout.tree:anything"},  # the package's own
        "model": {"trust_remote_code": True},
    }
    found = dict(run_config_code(raw))
    assert set(found) == {
        "reward.functions.1.name",
        "task.options.deep.list.1",
        "model.trust_remote_code",
    }


def test_every_model_and_tokenizer_load_passes_trust_remote_code(monkeypatch) -> None:
    """Every transformers load in models/loading.py gets the flag explicitly, off by
    default, on when asked (so transformers never prompts "[y/N]" on stdout)."""
    from policyopt.models import loading

    seen: list[tuple[str, object]] = []

    def recorder(kind, real):
        def load(location, *args, **kwargs):
            assert "trust_remote_code" in kwargs, kind
            seen.append((kind, kwargs["trust_remote_code"]))
            return real(location, *args, **kwargs)

        return load

    classes = (loading.AutoModelForCausalLM, loading.AutoTokenizer, loading.AutoConfig)
    for cls in classes:
        monkeypatch.setattr(cls, "from_pretrained", recorder(cls.__name__, cls.from_pretrained))
    for trust in (False, True):
        seen.clear()
        loading.load_model("tiny", trust_remote_code=trust)
        loading.load_model_config("tiny", trust_remote_code=trust)
        assert set(seen) == {(c.__name__, trust) for c in classes}
    seen.clear()
    loading.load_model("tiny")  # the default: off
    assert {v for _, v in seen} == {False}


def test_the_config_key_reaches_the_policy_load(monkeypatch) -> None:
    from policyopt.config.load import ModelConfig
    from policyopt.models import loading
    from policyopt.tasks.base import get_task
    from policyopt.train.policy import load_policy

    seen = {}

    def fake(name, **kwargs):
        seen.update(kwargs)
        return None, None

    monkeypatch.setattr(loading, "load_model", fake)
    load_policy(ModelConfig(trust_remote_code=True), get_task("arithmetic", train_size=4))
    assert seen.get("trust_remote_code") is True


def test_no_from_pretrained_in_the_package_leaves_trust_remote_code_implicit() -> None:
    """Every transformers `Auto*.from_pretrained(...)` call in the package passes
    `trust_remote_code` by keyword (read from the source's syntax tree)."""
    import ast

    import policyopt

    root = Path(policyopt.__file__).parent
    implicit = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if node.func.attr != "from_pretrained" or not (
                isinstance(owner, ast.Name) and owner.id.startswith("Auto")
            ):
                continue
            if not any(k.arg == "trust_remote_code" for k in node.keywords):
                implicit.append(f"{path.relative_to(root)}:{node.lineno}")
    assert implicit == []


# ----------------------------------------------------------------- 2. folders the user owns
USER_FILES = {"config.yaml": "model:\n  name_or_path: mine\n", "samples.jsonl": '{"x": 1}\n'}


def writers(folder: Path) -> dict[str, list[str]]:
    """Every command that writes into a folder the user names, aimed at `folder`."""
    return {
        "train": ["train", *small_overrides(folder, steps=1)],
        "quickstart": ["quickstart", "--output-dir", str(folder), "sft.steps=1"],
        "sft": ["sft", "--output-dir", str(folder), "sft.steps=1"],
        "compare": ["compare", "grpo", "--seeds", "1", "--output-dir", str(folder)],
    }


@pytest.mark.parametrize("command", list(writers(Path("."))))
def test_a_folder_of_the_users_files_is_refused_and_untouched(cwd, capsys, command) -> None:
    folder = cwd / "mine"
    folder.mkdir()
    for name, text in {**USER_FILES, "report.md": "# my notes\n"}.items():
        (folder / name).write_text(text)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    line = one_line_error(capsys, writers(folder)[command])
    assert str(folder) in line and "not a policyopt run folder" in line
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.parametrize("command", list(writers(Path("."))))
def test_a_folder_in_use_by_another_process_is_refused_at_once(cwd, capsys, command) -> None:
    folder = cwd / "live"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from policyopt.store import run_folder; "
            f"run_folder.claim({str(folder)!r}); print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_line_error(capsys, writers(folder)[command])
        assert str(folder) in line and "in use by another" in line
    finally:
        holder.kill()
        holder.wait()
    # The kernel dropped the dead holder's lock: the folder is free again.
    run_folder.claim(folder)
    run_folder.release(folder)


@pytest.mark.parametrize("command", ["train", "sft", "quickstart"])
def test_an_output_dir_that_is_a_file_is_one_line(cwd, capsys, command) -> None:
    (cwd / "afile").write_text("mine")
    line = one_line_error(capsys, writers(cwd / "afile")[command])
    assert "is a file" in line and (cwd / "afile").read_text() == "mine"


def test_a_run_that_fails_to_start_leaves_no_folder(cwd, capsys) -> None:
    argv = ["train", *small_overrides(cwd / "new", steps=1), "model.name_or_path=./no-model"]
    one_line_error(capsys, argv)
    assert not (cwd / "new").exists()


# ----------------------------------------------------------------- 6. a full disk
@pytest.mark.parametrize(
    "failure",
    [OSError(errno.ENOSPC, "No space left on device"), RuntimeError("basic_ios::clear")],
    ids=["ENOSPC", "torch-writer"],
)
def test_a_full_disk_during_a_save_is_one_line_naming_the_last_checkpoint(
    cwd, capsys, monkeypatch, failure
) -> None:
    import torch

    real_save = torch.save
    saves = []

    def full_after_first(obj, path, *args, **kwargs):
        saves.append(path)
        if len(saves) > 1:
            raise failure
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_after_first)
    monkeypatch.setattr(ckpt, "free_space", lambda path: 0)  # what a full disk reports
    argv = ["train", *small_overrides(cwd / "run", steps=2), "train.save_every=1"]
    line = one_line_error(capsys, argv, code=1)
    assert f"no space left on {cwd / 'run' / 'checkpoints'}" in line
    assert "the last complete checkpoint is step 1" in line
    assert [p.name for p in ckpt.list_checkpoints(cwd / "run")] == ["step-00000001"]
    assert not list(ckpt.checkpoint_root(cwd / "run").glob(".tmp-*"))  # space given back


def test_no_space_anywhere_else_is_one_line(cwd, capsys, monkeypatch) -> None:
    from policyopt.store.metrics_log import MetricsLogger

    def full(self, step, metrics):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.jsonl))

    monkeypatch.setattr(MetricsLogger, "log", full)
    line = one_line_error(capsys, ["train", *small_overrides(cwd / "run", steps=1)], code=1)
    assert "no space left on" in line and "metrics.jsonl" in line


# ----------------------------------------------------------------- 7. what eval evaluates
def test_eval_refuses_an_incomplete_newest_checkpoint(cwd, capsys) -> None:
    run = fake_run(cwd / "run", (1, 2))
    (ckpt.latest_checkpoint(run) / "tokenizer.json").unlink()  # step 2 lost a file
    line = one_line_error(capsys, ["eval", "--model", str(run)])
    assert "step-00000002" in line and "incomplete" in line and "step-00000001" in line


def test_a_model_folder_without_tokenizer_files_names_them(cwd, capsys) -> None:
    run = fake_run(cwd / "run", (1,))
    folder = ckpt.latest_checkpoint(run)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    line = one_line_error(capsys, ["eval", "--model", str(folder)])
    assert "no tokenizer files" in line and "tokenizer.json" in line
    assert "sentencepiece" not in line


@pytest.mark.slow
def test_eval_names_the_checkpoint_it_evaluates(cwd, capsys) -> None:
    run = fake_run(cwd / "run", (1, 3), **{"eval.size": "2", "rollout.max_new_tokens": "4"})
    assert main(["eval", "--model", str(run)]) == 0
    captured = capsys.readouterr()
    assert "checkpoint step 3" in captured.err and "step-00000003" in captured.err
    assert json.loads(captured.out)  # stdout: the JSON result only


# ----------------------------------------------------------------- 5. positions, in eval too
def test_eval_refuses_prompts_that_leave_no_positions(cwd, capsys) -> None:
    run = fake_run(cwd / "run", (1,), **{"rollout.max_new_tokens": "510", "eval.size": "4"})
    line = one_line_error(capsys, ["eval", "--model", str(run)])
    assert "eval row 0 " in line and "512" in line and "max_new_tokens=510" in line


# ----------------------------------------------------------------- F5. a mistyped model name
@pytest.mark.parametrize("name", ["HuggingFaceTB/SmolLM2-135M-Instrct", "smollm"])
@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "no network"])
def test_a_model_name_the_hub_cannot_answer_is_one_line_at_once(
    cwd, capsys, monkeypatch, name, offline
) -> None:
    import socket

    from policyopt.models import loading

    def no_hub(*args, **kwargs):
        raise AssertionError("asked the Hub")

    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", no_hub)
    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

        def unreachable(*args, **kwargs):
            raise OSError("Network is unreachable")

        monkeypatch.setattr(socket, "create_connection", unreachable)
    line = one_line_error(capsys, ["eval", "--model", name])
    assert f"model {name!r} is not a local folder" in line
    assert "did you mean 'smollm2'?" in line
    assert ("HF_HUB_OFFLINE" if offline == "HF_HUB_OFFLINE" else "unreachable") in line


# ----------------------------------------------------------------- F6. compare
@pytest.mark.slow
def test_compare_seeds_share_one_sft_warm_start(cwd, monkeypatch) -> None:
    from policyopt.cli import study
    from policyopt.pipelines.quickstart import sft_cache_key
    from policyopt.recipes import recipe_config

    planned = []
    monkeypatch.setattr(study, "execute", lambda runs, **kw: planned.extend(runs) or {})
    assert main(["compare", "grpo", "--seeds", "3", "--output-dir", "study"]) == 1
    keys = set()
    for run in planned:
        overrides = [a for a in run.args if "=" in a]
        keys.add(sft_cache_key(recipe_config(run.method, overrides, None, run.seed)))
    assert len(planned) == 3 and len(keys) == 1
    # Given its own SFT seed per run, each seed's warm start is its own again.
    planned.clear()
    main(["compare", "grpo", "--seeds", "2", "--output-dir", "study2", "train.sft_seed=null"])
    keys = {
        sft_cache_key(recipe_config("grpo", [a for a in r.args if "=" in a], None, r.seed))
        for r in planned
    }
    assert len(keys) == 2


BOUNDED = ["accuracy", "pass@1", "pass@8", "avg@8", "maj@8", "initial accuracy"]


@pytest.mark.parametrize("key", [*BOUNDED, "accuracy gain"])
def test_compare_intervals_stay_in_the_metrics_range(key) -> None:
    from policyopt.cli.compare import _fmt, interval

    low_end, high_end = (-1.0, 1.0) if key == "accuracy gain" else (0.0, 1.0)
    for mean, half in [(0.86, 1.016), (0.1, 0.5), (0.05, 0.02)]:
        low, high, clipped = interval((mean, half), key)
        assert low_end <= low <= high <= high_end
        assert clipped == (mean - half < low_end or mean + half > high_end)
    assert _fmt((0.86, 1.016), key) == "0.860 [0.000, 1.000]" or key == "accuracy gain"
    assert _fmt((0.5, 0.1), key) == "0.500 ± 0.100"


def test_compare_png_bars_stay_in_the_metrics_range(tmp_path, monkeypatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    from policyopt.cli.compare import plot_compare

    drawn = []
    real_bar = Axes.bar

    def bar(self, x, height, width, *args, yerr=None, **kwargs):
        drawn.append((list(height), yerr))
        return real_bar(self, x, height, width, *args, yerr=yerr, **kwargs)

    monkeypatch.setattr(Axes, "bar", bar)
    rows = [{"method": "grpo", "accuracy": (0.86, 1.016), "pass@2": (0.1, 0.3)}]
    plot_compare(rows, {}, tmp_path / "compare.png")
    ((heights, (below, above)),) = drawn
    for h, lo, hi in zip(heights, below, above, strict=True):
        assert h - lo >= 0.0 and h + hi <= 1.0


# ----------------------------------------------------------------- F7. one way to give a config
@pytest.mark.parametrize("command", ["train", "quickstart", "sft", "eval"])
def test_every_command_takes_the_config_file_positionally(cwd, capsys, command) -> None:
    (cwd / "mine.yaml").write_text("optim:\n  lr: 0.000123\n")
    extra = {"sft": ["--output-dir", "o"], "eval": ["--model", "tiny"]}.get(command, [])
    assert main([command, "mine.yaml", *extra, "--print-config"]) == 0
    assert "lr: 0.000123" in capsys.readouterr().out


def test_two_config_files_are_one_line(cwd, capsys) -> None:
    (cwd / "a.yaml").write_text("{}\n")
    line = one_line_error(capsys, ["eval", "a.yaml", "--config", "a.yaml", "--model", "tiny"])
    assert "two config files" in line


def test_quickstart_help_lists_the_recipes(capsys) -> None:
    from policyopt.recipes import recipe_names

    with pytest.raises(SystemExit):
        main(["quickstart", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps its help
    assert all(name in out for name in recipe_names())


def test_ctrl_c_in_a_study_run_stops_the_study_in_one_line(cwd, capsys, monkeypatch) -> None:
    from policyopt.cli import study

    started = []

    def interrupted(run, cli):
        started.append(run)
        return 130  # what `policyopt quickstart` returns after Ctrl-C (it saved its step)

    monkeypatch.setattr(study, "run_in_process", interrupted)
    line = one_line_error(capsys, ["compare", "grpo", "--seeds", "2", "--output-dir", "s"], 130)
    assert line.startswith("policyopt compare: interrupted in ") and "resumes" in line
    assert len(started) == 1  # the second seed never started


def test_quickstart_refuses_prompts_past_the_positions_before_its_sft(
    cwd, capsys, monkeypatch
) -> None:
    from policyopt.pipelines import quickstart

    def no_sft(*args, **kwargs):
        raise AssertionError("SFT ran")

    monkeypatch.setenv("POLICYOPT_CACHE", str(cwd / "cache"))
    monkeypatch.setattr(quickstart, "fine_tune", no_sft)
    argv = ["quickstart", "--output-dir", "q", "rollout.max_new_tokens=510", "sft.steps=5"]
    line = one_line_error(capsys, argv)
    assert "train row 0 " in line and "512" in line


@pytest.mark.parametrize("command", ["train", "eval"])
def test_ctrl_c_before_any_step_is_one_line(cwd, capsys, monkeypatch, command) -> None:
    import policyopt.train.parts as parts_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(parts_module, "build_parts", interrupted)
    monkeypatch.setattr("policyopt.train.trainer.build_parts", interrupted)
    argv = {"train": writers(cwd / "run")["train"], "eval": ["eval", "--model", "tiny"]}
    line = one_line_error(capsys, argv[command], 130)
    assert line == f"policyopt {command}: interrupted; the same command starts it again"
