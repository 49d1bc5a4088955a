"""Principle 4, no part can corrupt another, for reward functions: every call gets its own
copies of its inputs, a reward that exits or never returns becomes a named error, and a
reward's output is checked, whichever way the reward is reached.

The hostile functions below are run as a class, through the two ways a reward is called:
the pipeline (`RewardPipeline`, what the trainer, eval and the task verifier go through),
and a file task's `reward_function` option (`HFDatasetTask.verify`, one sample).
"""

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from policyopt.rewards import isolation
from policyopt.rewards.functions import (
    RewardFunctionError,
    RewardPipeline,
    build_reward_pipeline,
)
from policyopt.tasks import HFDatasetTask

PROMPTS = ["Q0", "Q1", "Q2"]
COMPLETIONS = ["wrong", "A:2", "wrong"]
LIMIT_S = 0.3  # the hung function's limit: short, the test waits for it once


def fresh_columns():
    return {
        "answer": ["1", "2", "3"],
        "meta": [{"tags": ["a"]}, {"tags": ["b"]}, {"tags": ["c"]}],
    }


# ----------------------------------------------------------------- the hostile functions
def mutates_lists(prompts, completions, answer, **columns):
    """Rewrites its inputs in place: without copies, every later function (and the logged
    samples) would see 'A:<answer>', a right answer, on every sample."""
    completions[:] = [f"A:{a}" for a in answer]
    prompts.clear()
    prompts.extend(["tampered"] * len(completions))
    answer.reverse()
    return [0.0] * len(completions)


def mutates_rows(prompts, completions, meta, **columns):
    """Edits the dicts of a column (nested values, not only the lists holding them)."""
    for m in meta:
        m["tags"].append("tampered")
        m["extra"] = 1
    return [0.0] * len(completions)


def exits_0(prompts, completions, **columns):
    sys.exit(0)


def exits_1(prompts, completions, **columns):
    sys.exit(1)


def returns_0d_array(prompts, completions, **columns):
    return np.array(1.0)


def returns_one_too_many(prompts, completions, **columns):
    return [1.0] * (len(completions) + 1)


def never_returns(release):
    def never_returns(prompts, completions, **columns):
        release.wait()  # a lock wait, as a stuck network call or a dead worker gives
        return [0.0] * len(completions)

    return never_returns


MUTATES = "mutates"  # outcome: no error, and nobody else sees the edits
HOSTILE = [
    (mutates_lists, MUTATES),
    (mutates_rows, MUTATES),
    (exits_0, r"reward function '{name}' failed on sample 0 .*SystemExit\(0\)"),
    (exits_1, r"reward function '{name}' failed on sample 0 .*SystemExit\(1\)"),
    (returns_0d_array, r"reward function '{name}' returned a 0-d numpy array"),
    (returns_one_too_many, r"reward function '{name}' returned \d values for \d completion"),
    (never_returns, rf"reward function '{{name}}' did not return within {LIMIT_S:g} s"),
]


@pytest.fixture
def release():
    """Lets a hung function's call end once the test is over (the process stays clean)."""
    event = threading.Event()
    yield event
    event.set()


def hostile_function(make, release):
    return make(release) if make is never_returns else make


def observer(seen):
    def observer(prompts, completions, **columns):
        seen.append({"prompts": prompts, "completions": completions, **columns})
        return [1.0 if c == "A:2" else 0.0 for c in completions]

    return observer


@pytest.mark.parametrize(("make", "outcome"), HOSTILE, ids=[h[0].__name__ for h in HOSTILE])
def test_hostile_reward_through_the_pipeline(make, outcome, release):
    fn = hostile_function(make, release)
    seen = []
    pipeline = RewardPipeline(
        [("hostile", fn, 1.0), ("after", observer(seen), 1.0)], timeouts={"hostile": LIMIT_S}
    )
    prompts, completions, columns = list(PROMPTS), list(COMPLETIONS), fresh_columns()
    if outcome == MUTATES:
        result = pipeline(prompts, completions, columns)
        # The later function scored the real completions: one right answer, not three.
        assert result.raw["after"] == [0.0, 1.0, 0.0]
        assert seen[0]["completions"] == COMPLETIONS and seen[0]["prompts"] == PROMPTS
        assert {k: seen[0][k] for k in fresh_columns()} == fresh_columns()
    else:
        with pytest.raises(RewardFunctionError, match=outcome.format(name="hostile")):
            pipeline(prompts, completions, columns)
    # What the caller keeps (and logs to samples.jsonl) is what it passed.
    assert prompts == PROMPTS and completions == COMPLETIONS and columns == fresh_columns()


@pytest.mark.parametrize(("make", "outcome"), HOSTILE, ids=[h[0].__name__ for h in HOSTILE])
def test_hostile_reward_as_a_file_tasks_reward_function(
    make, outcome, release, tmp_path, monkeypatch
):
    monkeypatch.setattr(isolation, "DEFAULT_TIMEOUT_S", LIMIT_S)
    fn = hostile_function(make, release)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "Q1", "answer": "2", "meta": {"tags": ["b"]}}\n')
    task = HFDatasetTask(str(data), reward_function=fn)
    row = dict(task.rows("train")[0])
    kept = {"prompt": "Q1", "answer": "2", "meta": {"tags": ["b"]}}
    if outcome == MUTATES:
        assert task.verify("A:2", row) == 0.0
    else:
        with pytest.raises(RewardFunctionError, match=outcome.format(name=fn.__name__)):
            task.verify("A:2", row)
    assert row == kept


def test_a_hung_reward_off_the_main_thread_is_stopped_too(release):
    """Off the main thread the limit is kept by a helper thread, which cannot be killed:
    the error says so."""
    pipeline = RewardPipeline([("stuck", never_returns(release), 1.0)], timeouts={"stuck": LIMIT_S})
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(pipeline, ["p"], ["c"], {})
        with pytest.raises(RewardFunctionError, match="did not return within 0.3 s") as caught:
            future.result()
        release.set()
    assert "cannot be stopped" in str(caught.value)


def test_a_pure_python_loop_is_interrupted_on_the_main_thread():
    def spins(prompts, completions, **columns):
        while True:
            pass

    pipeline = RewardPipeline([("spins", spins, 1.0)], timeouts={"spins": LIMIT_S})
    with pytest.raises(RewardFunctionError, match="'spins' did not return within 0.3 s"):
        pipeline(["p"], ["c"], {})
    # The pipeline and the process go on: the next call is scored.
    ok = RewardPipeline([("fine", lambda p, c, **k: [1.0] * len(c), 1.0)])
    assert ok(["p"], ["c"], {}).raw["fine"] == [1.0]


def test_time_limits_come_from_the_pipeline_the_function_or_the_default(release):
    def quick(prompts, completions, **columns):
        return [0.0] * len(completions)

    quick.time_limit_s = 5.0
    pipeline = build_reward_pipeline(
        [(f"{__name__}:exits_0", 1.0)], timeouts={f"{__name__}:exits_0": 2.0}
    )
    assert pipeline.timeouts == {f"{__name__}:exits_0": 2.0}
    assert RewardPipeline([("q", quick, 1.0)]).timeouts == {"q": 5.0}
    assert RewardPipeline([("f", mutates_rows, 1.0)]).timeouts == {"f": isolation.DEFAULT_TIMEOUT_S}
    with pytest.raises(ValueError, match="time limit of reward function 'q' must be > 0"):
        RewardPipeline([("q", quick, 1.0)], timeouts={"q": 0})
    with pytest.raises(ValueError, match="time limits for unknown reward functions: 'nope'"):
        RewardPipeline([("q", quick, 1.0)], timeouts={"nope": 1.0})


def test_user_interrupt_is_not_turned_into_a_reward_error():
    """Ctrl-C (KeyboardInterrupt on the main thread) still stops the run as itself."""

    def interrupted(prompts, completions, **columns):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        RewardPipeline([("i", interrupted, 1.0)])(["p"], ["c"], {})


def test_a_call_that_cannot_be_interrupted_ends_the_process():
    """A call stuck where the wake-up signal never reaches the interpreter (C code that does
    not return; here the signal is blocked) would hang the run forever: after the grace
    period the process ends, saying why, with a non-zero status."""
    script = """
import signal, time
from policyopt.rewards import isolation
from policyopt.rewards.functions import RewardPipeline
isolation.GRACE_S = 0.5

def deaf(prompts, completions, **columns):
    signal.pthread_sigmask(signal.SIG_BLOCK, {isolation.WAKE_SIGNAL})
    time.sleep(600)

RewardPipeline([("deaf", deaf, 1.0)], timeouts={"deaf": 0.3})(["p"], ["c"], {})
print("the run went on")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == isolation.EXIT_STATUS, done.stderr
    assert "the run went on" not in done.stdout
    assert (
        "reward function 'deaf' did not return within its time limit of 0.3 s and cannot be "
        "interrupted" in done.stderr
    )
