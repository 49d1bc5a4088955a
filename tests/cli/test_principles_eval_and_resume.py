"""Principles 4 and 6 (docs/guides/reliability.md) where evaluation and resume reach code or
state the user brought, each over its class of cases:

4. no part can corrupt another: held-out evaluation calls the task's verifier the way the
   reward pipeline calls a reward function (its own copies of the row, a time limit, a
   named error), so a verifier cannot change what later calls and the metrics see, hang
   `eval`, or end it in a traceback;
6. every failure is one line: a `verifiers` taskset module that cannot give its Taskset,
   and a resume onto a checkpoint of another model.
"""

import ast
import copy
import re
import sys
import textwrap
import threading
from pathlib import Path

import datasets
import pytest
import torch

from policyopt.cli.main import main
from policyopt.models.loading import load_tokenizer
from policyopt.rewards import isolation
from policyopt.rewards.functions import RewardFunctionError, RewardPipeline, RewardTimeoutError
from policyopt.rollout.base import RolloutEngine, Rollouts, SamplingParams
from policyopt.tasks.base import Task
from policyopt.train.held_out import evaluate
from run_configs import small_overrides


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """A fresh working folder (on sys.path, as main puts it); sys.path and sys.modules
    restored afterwards, so that each test's modules import afresh."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("vf_"):
            del sys.modules[name]


def one_line_error(capsys, argv: list[str], code: int = 2) -> str:
    """The command's error: exit `code`, one line, no traceback."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    head = f"policyopt {argv[0]}: "
    assert head in err, err
    tail = err[err.index(head) :].strip()
    assert "\n" not in tail, err
    return tail


# ----------------------------------------------------------------- 4. held-out verifiers
ROWS = [
    {"prompt": "Q0", "answer": "1", "meta": {"tags": ["a"]}},
    {"prompt": "Q1", "answer": "2", "meta": {"tags": ["b"]}},
]
GREEDY = ["A:1", "A:3"]
SAMPLED = ["A:1", "x", "A:2", "y"]  # 2 samples of each row, in row order
LIMIT_S = 0.3  # a hung verifier's limit: short, each test waits for it once


class TextEngine(RolloutEngine):
    """Answers its k-th call with `texts[k]` (one text per prompt, in order), each ended by
    EOS."""

    def __init__(self, tokenizer, texts: list[list[str]]) -> None:  # noqa: ANN001
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.texts = texts
        self.calls = 0

    def generate(self, prompts, params: SamplingParams, on_finished=None) -> Rollouts:  # noqa: ANN001
        texts = self.texts[self.calls]
        self.calls += 1
        assert len(texts) == len(prompts)
        ids = [
            self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            for t in texts
        ]
        width = max(len(i) for i in ids)
        out = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(ids), width)
        for r, row in enumerate(ids):
            out[r, : len(row)] = torch.tensor(row)
            mask[r, : len(row)] = 1.0
        p_ids = torch.zeros(len(ids), 1, dtype=torch.long)
        return Rollouts(
            prompt_ids=p_ids,
            prompt_mask=torch.ones_like(p_ids),
            response_ids=out,
            response_mask=mask,
            logp=torch.zeros(len(ids), width),
            entropies=mask.clone(),
            truncated=torch.zeros(len(ids), dtype=torch.bool),
            generated_tokens=int(mask.sum()),
        )


class Checked(Task):
    """A task whose verifier is `check`; what the metrics after it see is recorded."""

    name = "checked"

    def __init__(self, check) -> None:  # noqa: ANN001
        self.check = check
        self.metrics_saw: list = []

    def rows(self, split: str) -> datasets.Dataset:
        return datasets.Dataset.from_list(ROWS)

    def verify(self, completion: str, row: dict) -> float | None:
        return self.check(completion, row)

    def eval_metrics(self, completions: list[str], rows: list[dict]) -> dict[str, float]:
        self.metrics_saw.append((list(completions), copy.deepcopy(rows)))
        return {}


def right(completion: str, row: dict) -> float:
    return 1.0 if completion == f"A:{row['answer']}" else 0.0


# The hostile verifiers, each a (completion, row) -> reward as `Task.verify` is.
def edits_its_row(completion: str, row: dict) -> float:
    """Rewrites the row in place: without copies, every later call would find the answer
    right, and the metrics would read the edited rows."""
    score = right(completion, row)
    row["answer"] = completion.removeprefix("A:")
    row["meta"]["tags"].append("tampered")
    return score


def raises(completion: str, row: dict) -> float:
    raise RuntimeError("boom in verify")


def exits_0(completion: str, row: dict) -> float:
    sys.exit(0)


def exits_1(completion: str, row: dict) -> float:
    sys.exit(1)


def returns_text(completion: str, row: dict) -> object:
    return "yes"


def never_returns(release: threading.Event):
    def never_returns(completion: str, row: dict) -> float:
        release.wait(3600)
        return 0.0

    return never_returns


HERE = Path(__file__).name
HOSTILE = [
    (edits_its_row, None),
    (
        raises,
        rf"failed on sample 0 \(completion 'A:1'\): RuntimeError\('boom in verify'\) at "
        rf".*{HERE} line \d+",
    ),
    (exits_0, r"failed on sample 0 \(completion 'A:1'\): SystemExit\(0\) at .* line \d+"),
    (exits_1, r"failed on sample 0 \(completion 'A:1'\): SystemExit\(1\) at .* line \d+"),
    (returns_text, r"returned 'yes' for sample 0: a string"),
    (never_returns, rf"did not return within {LIMIT_S:g} s"),
]


@pytest.fixture
def release():
    """Lets a hung verifier's call end once the test is over (the process stays clean)."""
    event = threading.Event()
    yield event
    event.set()


def held_out(task: Task, samples: int = 2, reward_fn=None) -> dict[str, float]:  # noqa: ANN001
    tokenizer = load_tokenizer("tiny")
    return evaluate(
        task=task,
        rows=task.rows("eval"),
        tokenizer=tokenizer,
        engine=TextEngine(tokenizer, [GREEDY, SAMPLED]),
        max_new_tokens=8,
        samples=samples,
        correct_threshold=1.0,
        reward_fn=reward_fn,
    )


@pytest.mark.parametrize(("check", "outcome"), HOSTILE, ids=[h[0].__name__ for h in HOSTILE])
def test_a_hostile_verifier_in_held_out_evaluation(check, outcome, release, monkeypatch) -> None:
    """Every verifier call of held-out evaluation (greedy and sampled) goes through the
    reward pipeline's one call path: its own copy of the row, the time limit, a named
    error that says it was held-out evaluation."""
    monkeypatch.setattr(isolation, "DEFAULT_TIMEOUT_S", LIMIT_S)
    task = Checked(check(release) if check is never_returns else check)
    if outcome is None:
        out = held_out(task)
        # Scored on the rows as they are: row 0 right once greedy and once of 2 samples,
        # row 1 wrong greedy and right once of 2 samples.
        assert out["eval/accuracy"] == 0.5 and out["eval/reward"] == 0.5
        assert out["eval/pass@1"] == 0.5 and out["eval/pass@2"] == 1.0
        assert task.metrics_saw == [(GREEDY, ROWS)]
    else:
        with pytest.raises(RewardFunctionError, match=outcome) as raised:
            held_out(task)
        assert str(raised.value).startswith("held-out evaluation")
        assert "checked" in str(raised.value)  # the task whose verifier it is
        assert "\n" not in str(raised.value)


def test_held_out_verify_has_the_runs_time_limit_for_the_task_function(release) -> None:
    """The run's limit for its `task` reward function (`reward.functions[i].timeout_s`)
    limits the same verifier in held-out evaluation."""
    task = Checked(never_returns(release))
    pipeline = RewardPipeline([("task", lambda p, c, **k: [0.0] * len(c), 1.0)], {"task": 0.2})
    with pytest.raises(RewardTimeoutError, match=r"within 0\.2 s"):
        held_out(task, samples=0, reward_fn=pipeline)


def test_every_verifier_call_outside_a_task_goes_through_the_reward_path() -> None:
    """A task's `verify` is called, outside the task's own methods, only by the reward
    pipeline's adapter (`rewards/functions.py: task_reward_function`), whose calls go
    through `_score`: so no new caller (evaluation, a pipeline, a command) can call a
    verifier without its copies, time limit and named error. The package's syntax tree is
    read."""
    import policyopt

    root = Path(policyopt.__file__).parent
    callers: set[str] = set()

    def visit(node: ast.AST, where: str, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name  # calls are counted in the innermost function
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "verify"
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
        ):
            callers.add(f"{where}: {function}")
        for child in ast.iter_child_nodes(node):
            visit(child, where, function)

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text()), path.relative_to(root).as_posix(), "")
    assert callers == {"rewards/functions.py: verify"}  # task_reward_function's inner verify


BAD_REWARD_TASKSET = textwrap.dedent(
    """
    import verifiers.v1 as vf

    class BadTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
        @vf.reward(weight=1.0)
        async def looked_up(self, trace: vf.Trace) -> float:
            raise RuntimeError("boom in reward")

    class BadTaskset(vf.Taskset[BadTask, vf.TasksetConfig]):
        def load(self) -> list[BadTask]:
            return [
                BadTask(vf.TaskData(idx=i, prompt=f"Say {i}."), self.config.task)
                for i in range(3)
            ]

    __all__ = ["BadTaskset"]
    """
)


def test_a_verifiers_reward_that_raises_in_eval_is_one_line(cwd, capsys) -> None:
    pytest.importorskip("verifiers.v1")
    (cwd / "vf_badreward.py").write_text(BAD_REWARD_TASKSET)
    argv = [
        "eval",
        "--model",
        "tiny",
        "task.name=verifiers",
        "task.options.taskset=vf_badreward",
        "rollout.max_new_tokens=4",
        "eval.size=2",
        "train.progress=false",
    ]
    line = one_line_error(capsys, argv)
    assert "held-out evaluation" in line and "failed on sample 0" in line
    assert "boom in reward" in line and " line " in line


# ----------------------------------------------------------------- 6. verifiers tasksets
NOT_A_TASKSET = {
    "no __all__": ("import verifiers.v1 as vf\n", r"defines no `__all__`"),
    "no Taskset in __all__": (
        "import verifiers.v1 as vf\nX = 1\n__all__ = ['X']\n",
        r"exports no Taskset subclass via `__all__` \(found \['X'\]\)",
    ),
    "raises on import": (
        "raise RuntimeError('cannot start here')\n",
        r"its module failed to import: RuntimeError\('cannot start here'\) at .*vf_\w+\.py "
        r"line 1",
    ),
    "a syntax error": (
        "def broken(:\n",
        r"its module failed to import: SyntaxError: invalid syntax \(.*vf_\w+\.py line 1\)",
    ),
    "a missing dependency": (
        "import no_such_dependency_here\n",
        r"its module failed to import: ModuleNotFoundError\(\"No module named "
        r"'no_such_dependency_here'\"\) at .*vf_\w+\.py line 1",
    ),
}
# A one-step run of the embedded model that scores with the task's own verifier.
TINY_TRAIN = [
    "train.steps=1",
    "train.num_threads=1",
    "train.progress=false",
    "train.plot=false",
    "train.loggers=[jsonl]",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "eval.size=0",
    "reward.functions=[{name: task}]",
]
TASKSET_PLACES = {
    "task": ["task.name=verifiers", "task.options.taskset={module}"],
    "environment": [
        "task.name=verifiers",
        "task.options.taskset=glossary_taskset_for_tests",
        "rollout.strategy=multi_turn",
        "rollout.strategy_options={{environment: verifiers, environment_options: "
        "{{taskset: {module}}}}}",
    ],
}


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("place", list(TASKSET_PLACES))
@pytest.mark.parametrize("case", list(NOT_A_TASKSET))
def test_a_taskset_module_that_gives_no_taskset_is_one_line(
    cwd, capsys, command, place, case
) -> None:
    """Whichever config key names the taskset and whatever keeps its module from giving a
    Taskset subclass, the command ends in one line naming the taskset and what is wrong."""
    pytest.importorskip("verifiers.v1")
    module = "vf_" + re.sub(r"\W+", "_", case).lower()  # verifiers lowercases ids
    source, message = NOT_A_TASKSET[case]
    (cwd / f"{module}.py").write_text(source)
    overrides = [o.format(module=module) for o in TASKSET_PLACES[place]]
    if command == "train":
        argv = ["train", "--output-dir", "run", *TINY_TRAIN]
    else:
        argv = ["eval", "--model", "tiny", "eval.size=1", "rollout.max_new_tokens=2"]
    line = one_line_error(capsys, [*argv, *overrides])
    assert f"taskset {module!r}" in line or f"module {module!r}" in line, line
    assert re.search(message, line), line


def test_a_taskset_that_is_not_installed_is_still_named_so(cwd, capsys) -> None:
    pytest.importorskip("verifiers.v1")
    argv = ["eval", "--model", "tiny", "task.name=verifiers", "task.options.taskset=vf_absent"]
    assert "taskset 'vf_absent' not found" in one_line_error(capsys, argv)


# ----------------------------------------------------------------- 6. resume onto another model
def test_resume_anyway_onto_another_model_is_one_line(cwd, capsys) -> None:
    """`train.resume_anyway=true` accepts a changed config, not weights of another shape:
    the resume ends in one line naming the checkpoint, the first tensor that differs with
    both shapes, and what to do."""
    assert main(["train", *small_overrides(cwd / "run", 1)]) == 0
    capsys.readouterr()
    other = ["model.name_or_path=tiny-64x1", "train.resume_anyway=true"]
    line = one_line_error(capsys, ["train", *small_overrides(cwd / "run", 2), *other])
    assert "step-00000001" in line and "another model" in line
    assert re.search(r"model\.embed_tokens\.weight is \(\d+, 128\) there and \(\d+, 64\)", line)
    assert "train.output_dir" in line
