"""Which policyopt source files one training step runs, from `Trainer.run_step` to the
first `optimizer.step()`: `python tests/golden/step_files.py [grpo dapo hispo ...]`.

A profile hook records the file of every policyopt function called in between. Two counts:

(a) run: every file with a function that runs inside the step, in first-call order. This
    includes what no reader of the step needs to open: the engine's sampling internals
    (`rollout/hf_engine.py`, `llama_step.py`, `sampling.py`), the task's verifier and prompt
    format, the core math under a loss (`core/aggregation.py`), the log-prob kernels
    (`models/logprobs.py`), diagnostics.
(b) walk: the files a reader follows to see what the step does, the step's orchestration:
    the train-layer files (`train/*.py`) through which control passes, plus one file per
    plug point the step calls (DESIGN.md's five): where the bound rollout strategy, the
    reward pipeline, each shaper, each group filter, the advantage estimator and the policy
    loss are defined (`Trainer.parts`). Below a plug point's entry a reader is reading that
    part, not the step.

Also printed: the length of `train/step.py:train_step`, and every call from another
train-layer file back into `train/step.py` (a callback: control leaving the step's
function and coming back through another file). Works on any version of the trainer that
has `Trainer.run_step` (it measured the step before and after the issue-18 refactor;
(b) needs `Trainer.parts`, which the refactor introduced)."""

from __future__ import annotations

import inspect
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run_configs import small_overrides  # noqa: E402


def _trainer(algo: str) -> Any:
    import torch

    from policyopt.config.load import load_config
    from policyopt.train.trainer import Trainer

    torch.set_num_threads(1)
    out = tempfile.mkdtemp()
    extra = ["rollout.annotators=[{name: hispo_segments}]"] if algo == "hispo" else []
    return Trainer(
        load_config(overrides=[*small_overrides(Path(out), 1), f"algorithm.name={algo}", *extra])
    )


def _root() -> str:
    return str(Path(sys.modules["policyopt"].__file__).parent)


def _rel(path: str | None) -> str | None:
    root = _root()
    return path[len(root) + 1 :] if path and path.startswith(root) else None


def run_files(trainer: Any) -> tuple[list[str], set[tuple[str, str]]]:
    """(a): the files whose functions run in one step, in first-call order, and the call
    edges (caller file, callee file) between them."""
    files: list[str] = []
    edges: set[tuple[str, str]] = set()
    state = {"on": False, "done": False}

    def hook(frame, event, arg):  # noqa: ANN001, ANN202
        if event != "call" or state["done"]:
            return
        code = frame.f_code
        if code.co_name == "run_step" and _rel(code.co_filename) == "train/trainer.py":
            state["on"] = True
        if not state["on"]:
            return
        if code.co_name == "step" and "torch/optim" in code.co_filename:
            state["done"] = True  # the first optimizer.step()
            return
        here = _rel(code.co_filename)
        if here is None:
            return
        if here not in files:
            files.append(here)
        caller = frame.f_back
        while caller is not None and _rel(caller.f_code.co_filename) is None:
            caller = caller.f_back
        if caller is not None and _rel(caller.f_code.co_filename) != here:
            edges.add((_rel(caller.f_code.co_filename), here))

    sys.setprofile(hook)
    try:
        trainer.run_step()
    finally:
        sys.setprofile(None)
    return files, edges


def plug_point_files(trainer: Any) -> list[tuple[str, str]]:
    """(plug point, file defining the bound part the step calls), in the step's order."""
    parts = trainer.parts

    def where(obj: Any) -> str:
        fn = inspect.unwrap(obj)
        fn = getattr(fn, "func", fn)  # a functools.partial
        return _rel(inspect.getsourcefile(fn if callable(fn) else type(fn))) or "?"

    out = [("1 rollout strategy", where(parts.strategy.fn))]
    out += [(f"1 annotator {a.name}", where(a.fn)) for a in parts.annotators]
    out.append(("2a reward pipeline", where(type(parts.reward))))
    out += [(f"2b shaper {p.name}", where(p.fn)) for p, _ in parts.shapers]
    out += [("3 group filter", where(f)) for f in parts.filters]
    out.append(("4 advantage estimator", where(parts.advantage.fn)))
    out.append(("5 policy loss", where(parts.loss.fn)))
    return out


def walk(trainer: Any, files: list[str]) -> list[str]:
    """(b): the train-layer files of (a), then each plug point's file (once each)."""
    out = [f for f in files if f.startswith("train/")]
    for _, f in plug_point_files(trainer):
        if f not in out:
            out.append(f)
    return out


def report(algo: str) -> None:
    trainer = _trainer(algo)
    try:
        files, edges = run_files(trainer)
    finally:
        trainer.close()
    print(f"== {algo}")
    print(f"(a) {len(files)} policyopt files run inside the step (first-call order):")
    for f in files:
        print("     ", f)
    if hasattr(trainer, "parts"):
        path = walk(trainer, files)
        print(f"(b) the walk, {len(path)} files: the train-layer files, then the plug points:")
        for f in path:
            if f.startswith("train/"):
                print("     ", f)
        for point, f in plug_point_files(trainer):
            print(f"      {f}  ({point})")
    else:
        print("(b) n/a: this version has no Trainer.parts")
    step = sys.modules.get("policyopt.train.step")
    if step is not None and hasattr(step, "train_step"):
        lines, _ = inspect.getsourcelines(step.train_step)
        print(f"train/step.py:train_step is {len(lines)} lines")
    back = sorted(
        (a, b)
        for a, b in edges
        if b == "train/step.py" and a.startswith("train/") and a != "train/trainer.py"
    )
    print("callbacks into train/step.py:", ", ".join(f"{a} -> {b}" for a, b in back) or "none")
    crossings = sorted(
        {(a, b) for a, b in edges if a.startswith("train/") and b.startswith("train/")}
    )
    print("calls between train/ files:", ", ".join(f"{a} -> {b}" for a, b in crossings))


if __name__ == "__main__":
    for name in sys.argv[1:] or ["grpo"]:
        report(name)
