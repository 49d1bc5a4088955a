"""Which policyopt source files one training step runs, from `Trainer.train_step` to the
first `optimizer.step()`: `python tests/golden/step_files.py [grpo|hispo|...]`.

A profile hook records the file of every policyopt function called in between. Printed:
every file (and how many), and the call edges between packages' files, so that the walk a
reader follows (the files whose functions the step calls) can be read off. Works on any
version of the trainer that has `Trainer.train_step` (it measured the step before and after
the issue-18 refactor)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run_configs import small_overrides  # noqa: E402


def walk(algo: str) -> tuple[list[str], set[tuple[str, str]]]:
    import torch

    from policyopt.trainer.config import load_config
    from policyopt.trainer.trainer import Trainer

    torch.set_num_threads(1)
    out = tempfile.mkdtemp()
    extra = ["rollout.annotators=[{name: hispo_segments}]"] if algo == "hispo" else []
    trainer = Trainer(
        load_config(overrides=[*small_overrides(Path(out), 1), f"algorithm.name={algo}", *extra])
    )
    root = str(Path(sys.modules["policyopt"].__file__).parent)
    files: list[str] = []
    edges: set[tuple[str, str]] = set()
    state = {"on": False, "done": False}

    def rel(path: str) -> str | None:
        return path[len(root) + 1 :] if path.startswith(root) else None

    def hook(frame, event, arg):  # noqa: ANN001, ANN202
        if event != "call" or state["done"]:
            return
        code = frame.f_code
        if code.co_name == "train_step" and rel(code.co_filename) == "trainer/trainer.py":
            state["on"] = True
        if not state["on"]:
            return
        if code.co_name == "step" and "torch/optim" in code.co_filename:
            state["done"] = True  # the first optimizer.step()
            return
        here = rel(code.co_filename)
        if here is None:
            return
        if here not in files:
            files.append(here)
        caller = frame.f_back
        while caller is not None and rel(caller.f_code.co_filename) is None:
            caller = caller.f_back
        if caller is not None and rel(caller.f_code.co_filename) != here:
            edges.add((rel(caller.f_code.co_filename), here))

    sys.setprofile(hook)
    try:
        trainer.train_step()
    finally:
        sys.setprofile(None)
        trainer.close()
    return files, edges


if __name__ == "__main__":
    files, edges = walk(sys.argv[1] if len(sys.argv) > 1 else "grpo")
    print(f"{len(files)} policyopt files run inside the step (first call order):")
    for f in files:
        print("  ", f)
    trainer_files = [f for f in files if f.startswith("trainer/")]
    print(f"{len(trainer_files)} of them in trainer/: {', '.join(trainer_files)}")
    for name in (
        "trainer/trainer.py",
        "trainer/step.py",
        "trainer/rollout_phase.py",
        "trainer/update.py",
    ):
        called = sorted({b for a, b in edges if a == name})
        if called:
            print(f"{name} calls into {len(called)} files: {', '.join(called)}")
    crossings = sorted(
        {(a, b) for a, b in edges if a.startswith("trainer/") and b.startswith("trainer/")}
    )
    print("calls between trainer/ files:", ", ".join(f"{a} -> {b}" for a, b in crossings))
