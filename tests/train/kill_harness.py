"""Kill training processes with SIGKILL, restart them, and check the finished run equals an
uninterrupted one bit for bit (issue 13, item 12).

    python tests/train/kill_harness.py --runs 20 --seed 0

runs 20 training runs, each killed 1 to 3 times at random points and restarted until it
finishes, and prints how many equal the uninterrupted run. `test_kill_resume.py` runs one
run with a fixed list of kill points in CI.

A kill point is either a phase of a step, where the training process sends itself SIGKILL
(hooks wrap the library's functions in the killed process only; the library has no test
hooks), or a delay after which the harness kills it from outside. Phases:

    sample        after the step's rollouts were sampled (the RNGs have moved on)
    update        after the optimizer changed the weights in memory
    log           halfway through appending the step's line to metrics.jsonl
    save_state    during the checkpoint save: weights written, trainer state not yet
    save_marker   during the save: every file written, completion marker not yet
    save_publish  during the save: complete, not yet renamed into place
    save_prune    after the save, before older checkpoints are pruned

Training processes are forked from a "zygote" process that imported policyopt once, so a
restart costs its training time, not the imports (about 10 s on this machine). The
uninterrupted reference run is forked from the same zygote, as are the killed ones.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))
from run_configs import small_overrides  # noqa: E402

PHASES = (
    "sample",
    "update",
    "log",
    "save_state",
    "save_marker",
    "save_publish",
    "save_prune",
)
# A kill at these phases of step k keeps checkpoint k; at the others the run resumes from k - 1.
KEEPS_STEP = {"save_prune"}
# Differ between identical runs: wall-clock time.
TIMING_KEYS = ("time/", "tokens_per_s")


@dataclass
class Kill:
    phase: str | None = None  # one of PHASES, or None for a timed kill
    step: int = 0
    delay: float = 0.0  # seconds after start, for a timed kill

    def describe(self) -> str:
        return f"{self.phase}@{self.step}" if self.phase else f"after {self.delay:.2f}s"


def run_overrides(output_dir: Path, steps: int) -> list[str]:
    """The tiny run: a checkpoint every step, a few-second run."""
    return [
        *small_overrides(output_dir, steps),
        "train.save_every=1",
        "train.keep_last=2",
        "rollout.max_new_tokens=8",
    ]


# ----------------------------------------------------------------- in the killed process
def install_kill_hook(kill: Kill) -> None:
    """SIGKILL this process when it reaches `kill.phase` of step `kill.step`."""
    import policyopt.train.step as step_module
    import policyopt.train.trainer as trainer_module
    from policyopt.store import checkpoint as ckpt
    from policyopt.store.metrics_log import MetricsLogger

    current = {"step": 0}

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def after(fn, phase):  # noqa: ANN001, ANN202
        def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            out = fn(*args, **kwargs)
            if phase == kill.phase and current["step"] == kill.step:
                die()
            return out

        return wrapped

    def before(fn, phase):  # noqa: ANN001, ANN202
        def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if phase == kill.phase and current["step"] == kill.step:
                die()
            return fn(*args, **kwargs)

        return wrapped

    run_step = trainer_module.Trainer.run_step

    def counting_run_step(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        current["step"] = self.step + 1
        return run_step(self, *args, **kwargs)

    def save(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        current["step"] = self.step
        return trainer_save(self, *args, **kwargs)

    log = MetricsLogger.log

    def torn_log(self, step, metrics):  # noqa: ANN001, ANN202
        if kill.phase == "log" and step == kill.step:
            line = json.dumps({"step": step, **metrics})
            with self.jsonl.open("a") as fh:
                fh.write(line[: len(line) // 2])
            die()
        return log(self, step, metrics)

    trainer_save = trainer_module.Trainer.save
    trainer_module.Trainer.run_step = counting_run_step
    trainer_module.Trainer.save = save
    step_module.score = after(step_module.score, "sample")
    step_module.update = after(step_module.update, "update")
    MetricsLogger.log = torn_log
    ckpt.save_state = before(ckpt.save_state, "save_state")
    ckpt.mark_complete = before(ckpt.mark_complete, "save_marker")
    ckpt._publish = before(ckpt._publish, "save_publish")
    ckpt._prune = before(ckpt._prune, "save_prune")


def zygote() -> None:
    """Import once, then fork one training process per request (a JSON line on stdin)."""
    import policyopt.cli.main  # noqa: F401
    import policyopt.methods  # noqa: F401
    import policyopt.train.trainer  # noqa: F401
    import rewards_for_tests  # noqa: F401

    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        kill = Kill(**request["kill"]) if request["kill"] else None
        pid = os.fork()
        if pid == 0:  # the training process: never returns into this loop
            os._exit(train_process(request["args"], request["log"], kill))
        status = wait_or_kill(pid, kill.delay if kill and kill.phase is None else None)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        print(json.dumps({"killed": killed, "code": code}), flush=True)


def train_process(args: list[str], log_path: str, kill: Kill | None) -> int:
    code = 1
    try:
        with open(log_path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        if kill is not None and kill.phase is not None:
            install_kill_hook(kill)
        from policyopt.cli.main import main

        code = main(args)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def wait_or_kill(pid: int, delay: float | None) -> int:
    deadline = None if delay is None else time.monotonic() + delay
    while True:
        done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.005)


# ----------------------------------------------------------------- in the harness
class Zygote:
    def __init__(self) -> None:
        src = Path(__file__).resolve().parents[2] / "src"
        path = os.pathsep.join([str(src), str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"the zygote did not start (got {ready!r})")

    def run(self, output_dir: Path, steps: int, kill: Kill | None) -> dict[str, Any]:
        """One training process; returns {"killed": bool, "code": exit code or None}."""
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        request = {
            "args": ["train", *run_overrides(output_dir, steps)],
            "kill": kill.__dict__ if kill else None,
            "log": str(output_dir.parent / f"{output_dir.name}.log"),
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def latest_step(output_dir: Path) -> int:
    from policyopt.store.checkpoint import latest_checkpoint, step_of

    found = latest_checkpoint(output_dir)
    return step_of(found) if found is not None else 0


def run_with_kills(
    zygote: Zygote,
    output_dir: Path,
    steps: int,
    kills: list[Kill] | Callable[[int], Kill | None],
) -> list[tuple[Kill, bool, int]]:
    """Run to the end through `kills` (each a restart); check how much each kill lost.

    `kills` is a list, or a function of the newest checkpoint's step giving the next kill
    (None: no more). Returns (kill, whether it killed, step resumed from next) per kill.
    """
    planned = iter(kills) if isinstance(kills, list) else None
    done = []
    while True:
        before = latest_step(output_dir)
        kill = next(planned, None) if planned is not None else kills(before)
        if kill is None:
            break
        result = zygote.run(output_dir, steps, kill)
        after = latest_step(output_dir)
        if not result["killed"]:
            assert result["code"] == 0, f"{kill.describe()}: exited {result['code']}, see log"
        elif kill.phase is not None:
            # Exactly the steps since the last complete checkpoint are lost.
            expected = kill.step if kill.phase in KEEPS_STEP else kill.step - 1
            assert after == expected, f"{kill.describe()}: resumes from {after}, not {expected}"
        assert after >= before, f"{kill.describe()}: checkpoint went back {before} -> {after}"
        done.append((kill, result["killed"], after))
    result = zygote.run(output_dir, steps, None)
    assert result == {"killed": False, "code": 0}, f"final restart failed: {result}"
    return done


def differences(reference: Path, other: Path) -> list[str]:
    """What differs between two finished runs: final weights (safetensors), the trainer
    state (optimizer moments, RNGs, data position), metrics (but wall-clock times) and
    logged samples."""
    import torch
    from safetensors.torch import load_file

    from policyopt.store.checkpoint import latest_checkpoint, load_state
    from policyopt.store.metrics_log import read_metrics

    diffs = []
    a, b = latest_checkpoint(reference), latest_checkpoint(other)
    if a is None or b is None or a.name != b.name:
        return [f"final checkpoints {a} vs {b}"]
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    if wa.keys() != wb.keys() or not all(torch.equal(wa[k], wb[k]) for k in wa):
        diffs.append("final weights")
    if not equal_nested(load_state(a), load_state(b)):
        diffs.append("trainer state")

    def untimed(path: Path) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)}
            for r in read_metrics(path)
        ]

    if untimed(reference / "metrics.jsonl") != untimed(other / "metrics.jsonl"):
        diffs.append("metrics.jsonl")
    if (reference / "samples.jsonl").read_text() != (other / "samples.jsonl").read_text():
        diffs.append("samples.jsonl")
    return diffs


def equal_nested(x: Any, y: Any) -> bool:
    import torch

    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return (
            isinstance(x, torch.Tensor)
            and isinstance(y, torch.Tensor)
            and x.dtype == y.dtype
            and torch.equal(x, y)
        )
    if isinstance(x, dict):
        return (
            isinstance(y, dict)
            and x.keys() == y.keys()
            and all(equal_nested(x[k], y[k]) for k in x)
        )
    if isinstance(x, list | tuple):
        return type(x) is type(y) and len(x) == len(y) and all(map(equal_nested, x, y))
    return x == y


def random_kills(rng: random.Random, steps: int, timed_max: float) -> Callable[[int], Kill | None]:
    """1 to 3 kills, each at a random phase of a random step after the newest checkpoint,
    or (one in four) after a random delay."""
    budget = rng.randint(1, 3)

    def next_kill(latest: int) -> Kill | None:
        nonlocal budget
        if budget == 0 or latest == steps:
            return None
        budget -= 1
        if rng.random() < 0.25:
            return Kill(delay=round(rng.uniform(0.0, timed_max), 3))
        return Kill(phase=rng.choice(PHASES), step=rng.randint(latest + 1, steps))

    return next_kill


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    args = parser.parse_args()
    if args.zygote:
        zygote()
        return 0
    import tempfile

    root = Path(args.dir or tempfile.mkdtemp(prefix="kill-harness-"))
    z = Zygote()
    t0 = time.monotonic()
    assert z.run(root / "reference", args.steps, None) == {"killed": False, "code": 0}
    reference_s = time.monotonic() - t0
    rng = random.Random(args.seed)
    equal = kills_done = 0
    for i in range(args.runs):
        kills = random_kills(rng, args.steps, reference_s)
        out = root / f"run-{i:02d}"
        try:
            done = run_with_kills(z, out, args.steps, kills)
            diffs = differences(root / "reference", out)
        except AssertionError as err:
            done, diffs = [], [f"check failed: {err}"]
        equal += not diffs
        kills_done += sum(hit for _, hit, _ in done)
        points = ", ".join(
            f"{k.describe()}{'' if hit else ' (ran to the end first)'} -> resumes at {s}"
            for k, hit, s in done
        )
        print(f"run {i:2d}: {'equal' if not diffs else 'DIFFERS: ' + ', '.join(diffs)}  [{points}]")
    z.close()
    print(
        f"{equal} of {args.runs} resumed runs equal the uninterrupted run "
        f"({kills_done} kills; {time.monotonic() - t0:.0f} s; {root})"
    )
    return 0 if equal == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
