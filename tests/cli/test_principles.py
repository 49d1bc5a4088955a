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


def fake_run(folder: Path, steps: tuple[int, ...], via_base: bool = False, **config_values) -> Path:
    """A run folder with complete checkpoints at `steps` (the embedded model's files, no
    training) and the saved config with `config_values` (dotted key -> YAML value); with
    `via_base`, the saved config is only `base: base.yaml`, and that file beside it holds
    the values."""
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
        if via_base:
            (target / "base.yaml").write_text(text)
            (target / ckpt.CONFIG_FILE).write_text("base: base.yaml\n")
        else:
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
    # A verifiers taskset id is a module name without ':function' (verifiers imports it).
    "verifiers taskset": {"task.name": "verifiers", "task.options": "{taskset: shipped_rewards}"},
    "verifiers environment taskset": {
        "rollout.strategy": "multi_turn",
        "rollout.strategy_options": (
            "{environment: verifiers, environment_options: {taskset: shipped_rewards}}"
        ),
    },
}


@pytest.mark.parametrize("place", list(RUN_CODE))
@pytest.mark.parametrize("given", ["run folder", "checkpoint folder"])
@pytest.mark.parametrize("written", ["in its config", "in its base: file"])
def test_eval_never_runs_code_a_run_folder_names(cwd, capsys, place, given, written) -> None:
    (cwd / "shipped_rewards.py").write_text(SENTINEL_MODULE)  # shipped inside the run
    (cwd / "data.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    via_base = written == "in its base: file"
    run = fake_run(cwd / "run", (1,), via_base=via_base, **RUN_CODE[place])
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
    from policyopt.core.user_code import CODE_OPTIONS, config_code

    raw = {
        "reward": {"functions": [{"name": "task"}, {"name": "pkg.mod:fn"}]},
        "task": {
            "options": {
                "deep": {"list": ["x", "other:thing"]},
                "template": "A: {prompt}",
                "taskset": "vfmodule",
            }
        },
        "rollout": {
            "strategy": "policyopt.rollout.tree:anything",  # the package's own
            "strategy_options": {"environment_options": {"taskset": "owner/vf-env@1.0"}},
        },
        "model": {"trust_remote_code": True},
    }
    found = {key: name for key, name, _ in config_code(raw)}
    assert found == {
        "reward.functions.1.name": "pkg.mod",
        "task.options.deep.list.1": "other",
        "task.options.taskset": "vfmodule",
        "rollout.strategy_options.environment_options.taskset": "owner/vf-env@1.0",
        "model.trust_remote_code": None,
    }
    assert set(CODE_OPTIONS) <= set(found)  # every declared bare-module option is read


def test_the_gate_refuses_at_the_import_point_what_a_foreign_config_names(cwd) -> None:
    """The one decision, applied where code is imported: inside a foreign config, a module
    the user did not name is refused before it is imported; the user's own names,
    policyopt's own modules, and anything outside a foreign config are imported."""
    from policyopt.core import user_code

    (cwd / "shipped_rewards.py").write_text(SENTINEL_MODULE)
    sys.path.insert(0, str(cwd))  # as main puts the working folder (the fixture restores it)
    given = {"reward.functions": [{"name": "mine:score"}], "model.trust_remote_code": True}
    with user_code.foreign_config("run/run_config.yaml", "say yes", given):
        with pytest.raises(user_code.UserCodeRefused, match="'shipped_rewards'.*say yes"):
            user_code.import_user_code("shipped_rewards", "module 'shipped_rewards'")
        assert not (cwd / "IMPORTED").exists()
        with pytest.raises(user_code.UserCodeRefused, match="taskset"):
            user_code.allow_user_code("verifiers taskset 'vf'", name="vf")
        user_code.allow_user_code("module 'mine'", name="mine")  # the user named it
        user_code.allow_user_code("remote code", key="model.trust_remote_code")  # and set it
        assert user_code.import_user_code("policyopt.core.stats", "own").__name__
    user_code.import_user_code("shipped_rewards", "module 'shipped_rewards'")
    assert (cwd / "IMPORTED").exists()


# Imports by a computed name whose names come from the package's own source, never a config.
OWN_NAME_IMPORTS = {
    "core/__init__.py: __getattr__": "policyopt.core's own modules (_HOME)",
    "models/__init__.py: __getattr__": "policyopt.models' own modules (_EXPORTS)",
    "core/registry.py: load": "the modules that `Registry.lazy` calls in the package declare",
    "pipelines/__init__.py: run_quickstart": "the PIPELINES table",
    "store/metrics_log.py: _optional": "the loggers' packages (tensorboard, wandb)",
}
# Import points of config-named code in files whose owners add the gate's one-line call
# (docs/guides/reliability.md, principle 1). Remove an entry once its call is in: the test
# then fails until it is.
NOT_YET_GATED: set[str] = set()
IMPORTERS = {"import_module", "__import__", "taskset_class"}
GATES = {"allow_user_code", "import_user_code"}


def code_import_points() -> dict[str, bool]:
    """'file: function' -> whether the function passes the gate, for every function in the
    package that imports a module by a computed name (`importlib.import_module`,
    `__import__`, verifiers' `taskset_class`) or loads a transformers model with a
    `trust_remote_code` that is not the constant False."""
    import ast

    import policyopt

    root = Path(policyopt.__file__).parent

    def called(node: ast.Call) -> str:
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")

    def imports_code(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        if called(node) in IMPORTERS:
            return not (node.args and isinstance(node.args[0], ast.Constant))
        trust = [k.value for k in node.keywords if k.arg == "trust_remote_code"]
        return called(node) == "from_pretrained" and any(
            not (isinstance(v, ast.Constant) and v.value is False) for v in trust
        )

    points: dict[str, bool] = {}
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "core/user_code.py":
            continue  # the gate itself
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            inner = list(ast.walk(fn))
            if any(imports_code(n) for n in inner):
                gated = any(isinstance(n, ast.Call) and called(n) in GATES for n in inner)
                points[f"{path.relative_to(root).as_posix()}: {fn.name}"] = gated
    return points


def test_every_import_by_a_computed_name_goes_through_the_gate() -> None:
    """Code a config can name reaches Python only through `core/user_code.py`'s gate, so a
    new option that imports code cannot bypass the decision `eval` makes for a foreign run
    config. The syntax tree of the whole package is read."""
    points = code_import_points()
    ungated = {p for p, gated in points.items() if not gated}
    assert ungated - set(OWN_NAME_IMPORTS) == NOT_YET_GATED
    assert set(OWN_NAME_IMPORTS) <= set(points)  # the table names real import points


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


# An output file named on the command line is the user's to overwrite (as with -o): each
# option says so, and the file is replaced whole or not at all.
OUTPUT_FILE_OPTIONS = {"eval": "--json-out", "bench": "--json-out", "config-reference": "--write"}


@pytest.mark.parametrize("command", list(OUTPUT_FILE_OPTIONS))
def test_every_output_file_option_says_it_overwrites(capsys, command) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps its help
    option = OUTPUT_FILE_OPTIONS[command]
    assert f"{option} PATH" in text
    # Its own help: after its last mention (the first is in the usage line).
    assert "overwritten if it exists" in text.rsplit(f"{option} PATH", 1)[1].split(" --", 1)[0]


def test_an_interrupted_output_write_leaves_the_old_file_whole(cwd, capsys, monkeypatch) -> None:
    (cwd / "ref.md").write_text("mine")
    real = Path.write_text

    def half_then_full(self, data, *args, **kwargs):
        real(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    with monkeypatch.context() as patched:
        patched.setattr(Path, "write_text", half_then_full)
        line = one_line_error(capsys, ["config-reference", "--write", "ref.md"], code=1)
    assert "no space left" in line
    assert (cwd / "ref.md").read_text() == "mine"
    assert [p.name for p in cwd.iterdir()] == ["ref.md"]  # no temporary file left behind
    assert main(["config-reference", "--write", "ref.md"]) == 0
    assert (cwd / "ref.md").read_text().startswith("# ")  # overwritten, as its help says


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


def loads_of(model: Path, out: Path) -> dict[str, list[str]]:
    """Every command that loads a model, with `model` as its model."""
    setting = f"model.name_or_path={model}"
    return {
        "train": ["train", *small_overrides(out, steps=1), setting],
        "sft": ["sft", "--output-dir", str(out), "sft.steps=1", setting],
        "quickstart": ["quickstart", "--output-dir", str(out), "sft.steps=1", setting],
        "quickstart, no sft": ["quickstart", "--output-dir", str(out), "sft.steps=0", setting],
        "eval": ["eval", "--model", str(model)],
    }


@pytest.mark.parametrize("command", list(loads_of(Path("m"), Path("o"))))
@pytest.mark.parametrize("given", ["checkpoint folder", "its merged folder"])
def test_every_command_refuses_an_incomplete_checkpoint_as_its_model(
    cwd, capsys, command, given
) -> None:
    """A checkpoint folder named directly (not through its run folder) whose save did not
    complete is refused before any work, naming the newest complete one of its run."""
    run = fake_run(cwd / "run", (1, 2))
    newest = ckpt.latest_checkpoint(run)
    shutil.copytree(tiny_model_path(), newest / "merged")
    ckpt.mark_complete(newest, 2)
    (newest / "merged" / "model.safetensors").write_bytes(b"half")  # the save stopped here
    model = newest if given == "checkpoint folder" else newest / "merged"
    line = one_line_error(capsys, loads_of(model, cwd / "out")[command])
    assert f"checkpoint {model} is incomplete" in line and "step-00000001" in line
    assert not (cwd / "out").exists()


def test_a_model_folder_without_tokenizer_files_names_them(cwd, capsys) -> None:
    run = fake_run(cwd / "run", (1,))
    folder = ckpt.latest_checkpoint(run)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    ckpt.mark_complete(folder, 1)  # saved without them (else: an incomplete checkpoint)
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


@pytest.mark.parametrize("command", list(loads_of(Path("m"), Path("o"))))
def test_every_command_refuses_a_chat_template_the_tokenizer_lacks(
    cwd, capsys, monkeypatch, command
) -> None:
    """model.chat_template=true with the embedded model's character tokenizer (no chat
    template) is one line before any work: no SFT, no rollout, no evaluation."""
    from policyopt.train import held_out

    def no_work(*args, **kwargs):
        raise AssertionError("work started")

    monkeypatch.setenv("POLICYOPT_CACHE", str(cwd / "cache"))
    monkeypatch.setattr("policyopt.pipelines.quickstart.run_sft", no_work)
    monkeypatch.setattr(held_out, "evaluate_run", no_work)
    argv = [*loads_of(Path("tiny"), cwd / "out")[command], "model.chat_template=true"]
    line = one_line_error(capsys, argv)
    assert "model.chat_template: true" in line and "has no chat template" in line


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


@pytest.mark.parametrize(
    ("command", "long"), [("sft", "prompt"), ("sft", "solution"), ("quickstart", "solution")]
)
def test_sft_refuses_examples_past_the_positions_before_its_first_step(
    cwd, capsys, monkeypatch, command, long
) -> None:
    """Prompt + demonstration + EOS over the embedded model's 512 positions, in `sft` and
    in the quickstart's warm start (whose RL check passes: its prompts are short)."""
    import json

    from policyopt.train import sft

    def no_step(*args, **kwargs):
        raise AssertionError("SFT took a step")

    monkeypatch.setenv("POLICYOPT_CACHE", str(cwd / "cache"))
    monkeypatch.setattr(sft, "sft_backward", no_step)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1), "sol": str(i + 1)} for i in range(4)]
    rows[1].update({"prompt": "x" * 700} if long == "prompt" else {"sol": "x" * 900})
    (cwd / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = "task.options={path: long.jsonl, solution_column: sol, eval_path: long.jsonl}"
    argv = [command, "--output-dir", "out", "sft.steps=2", "task.name=hf_dataset", options]
    line = one_line_error(capsys, [*argv, "eval.size=2"])
    assert "SFT: train row 1 (counting from 0) of task 'hf_dataset' " in line
    assert "task.options.path=long.jsonl" in line and "more than the 512 of " in line
    assert not (cwd / "out").exists()


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
