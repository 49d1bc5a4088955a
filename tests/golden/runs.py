"""Golden runs: a few steps of each method at a fixed seed on one thread, summarised as the
SHA-256 of the final weights, a numeric fingerprint of them (per tensor: sum, L2 norm and a
projection on a fixed random direction) and the logged metrics (wall-clock fields dropped).

Bits depend on the CPU: the same code and packages on another x86 CPU (other SIMD kernels
for exp, log and matmul) give differences of about 1e-7 relative after a few steps (measured:
AMD EPYC against the recording machine, entropy first). So the test compares the
metrics to a relative 1e-5, the fingerprint to 1e-4 of each tensor's norm (the final
weights carry every step's rounding: 2.8e-5 of the norm measured on another EPYC), and the
SHA-256 only when asked
(`POLICYOPT_GOLDEN_EXACT=1`, for a refactor proven bit for bit on the recording machine).

A refactor of the training step must leave every summary identical (tests/golden/
test_golden_runs.py); a change of numbers on purpose is named in its commit and recorded
again with `python tests/golden/record.py`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from run_configs import small_overrides  # noqa: E402

GOLDEN = Path(__file__).with_name("golden.json")
# Wall-clock fields differ from run to run; everything else is a function of the seed.
WALL_CLOCK = ("time/", "tokens_per_s")


def _lm(out: Path, *extra: str, steps: int = 2) -> list[str]:
    return [*small_overrides(out, steps), "eval.every=0", *extra]


def _ranking(out: Path, *extra: str) -> list[str]:
    task = "{train_size: 40, eval_size: 8, docs_per_query: 12, num_features: 10}"
    return [
        f"train.output_dir={out}",
        "train.steps=2",
        "train.num_threads=1",
        "train.loggers=[jsonl]",
        "train.progress=false",
        "train.plot=false",
        "train.save_every=0",
        f"task.options={task}",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=5",
        "optim.lr=0.01",
        "eval.every=0",
        *extra,
    ]


def _docpo(out: Path) -> list[str]:
    return [
        f"train.output_dir={out}",
        "train.steps=2",
        "train.num_threads=1",
        "train.loggers=[jsonl]",
        "train.progress=false",
        "train.plot=false",
        "rollout.group_size=4",
        "optim.lr=0.001",
        "algorithm.name=docpo",
        "algorithm.group_filter=null",
        "task.name=docparse",
        "task.options={train_size: 24, eval_size: 4}",
        "reward.functions=[{name: docparse}]",
        "reward.correct_threshold=0.99",
        "rollout.prompts_per_step=3",
        "rollout.max_new_tokens=16",
        "eval.size=4",
        "eval.every=0",
    ]


def _dmrl(out: Path) -> list[str]:
    """DRPO on the live DMRL environment with a small LRP trained here (untrained editor:
    its edits do not parse, so the control term alone gives the advantages)."""
    from policyopt.pipelines.dmrl import train_and_evaluate_lrp

    options = {
        "seed": 0,
        "users_per_arm": 50,
        "history": 24,
        "lrp": {"hidden": 8, "warmup_epochs": 5, "disc_epochs": 2, "joint_epochs": 2},
    }
    lrp = train_and_evaluate_lrp(options, out / "lrp")
    task = {
        **options,
        "mode": "live",
        "eval_users": 50,
        "train_size": 8,
        "eval_size": 2,
        "lrp_path": str(out / "lrp"),
        "first_day": int(lrp["first_online_day"]),
    }
    return [
        f"train.output_dir={out / 'run'}",
        "train.steps=2",
        "train.num_threads=1",
        "train.loggers=[jsonl]",
        "train.progress=false",
        "train.plot=false",
        "algorithm.name=dmrl",
        "task.name=dmrl_skill",
        f"task.options={json.dumps(task)}",
        "rollout.group_size=4",
        "rollout.prompts_per_step=1",
        "rollout.max_new_tokens=16",
        "optim.lr=0.001",
        "eval.size=0",
        "eval.every=0",
    ]


# name -> (overrides builder, recipe base or None)
RUNS: dict[str, tuple[Callable[[Path], list[str]], str | None]] = {
    "grpo": (lambda out: _lm(out, "algorithm.name=grpo"), None),
    "dapo_dynamic_sampling": (
        lambda out: _lm(
            out,
            "algorithm.name=dapo",
            "reward.functions=[{name: 'rewards_for_tests:digit_fraction_even_answers'}]",
            "algorithm.max_sampling_rounds=3",
            steps=3,
        ),
        None,
    ),
    "gspo_4_minibatches": (lambda out: _lm(out, "algorithm.name=gspo"), None),
    "hispo": (
        lambda out: _lm(
            out,
            "algorithm.name=hispo",
            "rollout.annotators=[{name: hispo_segments, options: {window: 4}}]",
        ),
        None,
    ),
    "gar": (
        lambda out: _lm(out, "algorithm.name=gar", "reward.correct_threshold=0.1"),
        None,
    ),
    "datpo": (
        lambda out: _lm(
            out,
            "algorithm.name=datpo",
            "rollout.strategy_options.fork_unit=token",
            "reward.shapers=[{name: datpo_diversity, options: {embedder: policy}}]",
        ),
        None,
    ),
    "docpo": (_docpo, None),
    # Adam's eps 1e-3, not 1e-8: the PL scores are shift-invariant, so some weights' true
    # gradient is 0 and Adam would step them by lr on rounding noise alone, which differs
    # between CPUs (test_ranking_run_holds_under_other_cpu_kernels).
    "srpo_pl": (lambda out: _ranking(out, "algorithm.name=srpo", "optim.eps=1e-3"), "srpo"),
    "drpo_dmrl": (_dmrl, None),
}


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over the state dict: each tensor's name, dtype, shape and bytes, by name."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def weights_fingerprint(model: torch.nn.Module) -> dict[str, list[float]]:
    """Per tensor, in float64: [sum, L2 norm, dot with a fixed N(0, 1) direction]."""
    out = {}
    for name, t in sorted(model.state_dict().items()):
        x = t.detach().cpu().double().flatten()
        g = torch.Generator().manual_seed(0)
        direction = torch.randn(x.numel(), generator=g, dtype=torch.float64)
        out[name] = [float(x.sum()), float(x.norm()), float(x @ direction)]
    return out


def run(name: str, out: Path) -> dict[str, Any]:
    """Train golden run `name` under `out`; its weights digest, whether the weights moved,
    and its metrics lines without wall-clock fields."""
    from policyopt.config.load import load_config
    from policyopt.recipes import recipe_dict
    from policyopt.train.trainer import Trainer

    torch.set_num_threads(1)
    build, base = RUNS[name]
    overrides = build(out)
    config = load_config(None, overrides, base=recipe_dict(base) if base else None)
    trainer = Trainer(config)
    try:
        initial = weights_digest(trainer.model)
        trainer.train()
        final = weights_digest(trainer.model)
        fingerprint = weights_fingerprint(trainer.model)
    finally:
        trainer.close()
    lines = Path(config.train.output_dir, "metrics.jsonl").read_text().splitlines()
    metrics = [
        {k: v for k, v in json.loads(line).items() if not k.startswith(WALL_CLOCK)}
        for line in lines
    ]
    return {
        "weights_sha256": final,
        "weights_fingerprint": fingerprint,
        "moved": final != initial,
        "metrics": metrics,
    }
