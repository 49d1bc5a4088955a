"""A study: methods x seeds x named overrides, each cell a `policyopt quickstart` run.

Each run has its own folder `DIR/<method>[@<variant>]/seed-<s>` and an exact command
(`Run.command`). A run whose `summary.json` exists is finished and skipped; any other run is
started with its command, and the trainer resumes it from its latest checkpoint in that
folder (`train.resume=auto`), so the same study command again finishes a killed study.

Runs execute one after another in this process (`workers=1`), as `workers` parallel worker
processes with one thread each, or as Ray tasks of one CPU each (`ray_address`); a worker
runs the same command as the one recorded, and its output goes to the run's `run.log`.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
INTERRUPTED = 130  # what `policyopt` returns on Ctrl-C (cli/main.py), as a shell does


@dataclass(frozen=True)
class Variant:
    """A named set of overrides (`--variant NAME:KEY=VALUE,KEY=VALUE`); "" is the plain cell."""

    name: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    method: str
    variant: Variant
    seed: int
    out: Path
    args: tuple[str, ...] = field(default=())  # `policyopt` arguments after the program name

    @property
    def cell(self) -> str:
        return self.method + (f"@{self.variant.name}" if self.variant.name else "")

    @property
    def command(self) -> str:
        return "policyopt " + shlex.join(self.args)

    def finished(self) -> bool:
        return (self.out / "summary.json").exists()


def parse_variant(spec: str) -> Variant:
    """`NAME:KEY=VALUE,KEY=VALUE` (a value holding a comma: repeat the variant's name with
    one override per `--variant`)."""
    name, sep, rest = spec.partition(":")
    overrides = tuple(o for o in rest.split(",") if o) if sep else ()
    bad = [o for o in overrides if "=" not in o]
    if not name or not sep or not overrides or bad or "@" in name or "/" in name:
        raise ValueError(
            f"--variant wants NAME:KEY=VALUE[,KEY=VALUE...] with a name without '@' or '/', "
            f"e.g. stale2:rollout.staleness=2; got {spec!r}"
        )
    return Variant(name, overrides)


def merge_variants(variants: list[Variant]) -> list[Variant]:
    """Variants given under one name more than once are one variant with all the overrides."""
    merged: dict[str, list[str]] = {}
    for v in variants:
        merged.setdefault(v.name, []).extend(v.overrides)
    return [Variant(name, tuple(o)) for name, o in merged.items()]


def plan(
    methods: list[str],
    seeds: int,
    root: Path,
    overrides: list[str],
    *,
    recipe: str | None = None,
    variants: list[Variant] | None = None,
    one_thread: bool = False,
) -> list[Run]:
    """The study's runs, methods first (so parallel workers start different seeds of one
    method together and later methods reuse their cached SFT starts). With `recipe`, every
    method is that recipe with `algorithm.name=<method>`; without, a method's own recipe."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    cells = variants or [Variant("")]
    runs = []
    for method in methods:
        for variant in cells:
            for seed in range(seeds):
                cell = method + (f"@{variant.name}" if variant.name else "")
                out = root / cell / f"seed-{seed}"
                args = ["quickstart", recipe or method, "--output-dir", str(out)]
                args += ["--seed", str(seed)]
                extra = [f"algorithm.name={method}"] if recipe else []
                extra += [*overrides, *variant.overrides]
                if one_thread:
                    extra.append("train.num_threads=1")
                runs.append(Run(method, variant, seed, out, tuple(args + extra)))
    return runs


def _log_run(run: Run) -> subprocess.CompletedProcess:
    """Run `run.command` in a fresh process with one thread, appending to its run.log."""
    run.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **ONE_THREAD}
    with open(run.out / "run.log", "a") as log:
        log.write(f"\n$ {run.command}  ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        log.flush()
        return subprocess.run(
            [sys.executable, "-m", "policyopt.cli.main", *run.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        )


def run_in_process(run: Run, cli: Callable[[list[str]], int]) -> int:
    """The run's command through the CLI entry `cli` in this process (workers=1). The entry is
    passed in by the caller (`policyopt compare` hands over `cli.main`): importing it here
    would close an import cycle main -> compare -> study -> main."""
    return cli(list(run.args))


def execute(
    runs: list[Run],
    *,
    workers: int = 1,
    ray_address: str | None = None,
    on_done: Callable[[Run, str], None] | None = None,
    cli: Callable[[list[str]], int] | None = None,
) -> dict[str, str]:
    """Run every unfinished run; returns run folder -> "finished earlier", "ran" or
    "failed (exit N)"."""
    status: dict[str, str] = {}
    todo = []
    for run in runs:
        if run.finished():
            status[str(run.out)] = "finished earlier"
        else:
            todo.append(run)

    def record(run: Run, code: int) -> None:
        if code in (INTERRUPTED, -signal.SIGINT):  # -2: a worker killed by the signal
            # Ctrl-C stops the study, not just this run (which saved where it stopped).
            raise KeyboardInterrupt(
                f"interrupted in {run.out}; the same command resumes the study there"
            )
        status[str(run.out)] = "ran" if code == 0 and run.finished() else f"failed (exit {code})"
        if on_done is not None:
            on_done(run, status[str(run.out)])

    if ray_address is not None:
        for run, code in zip(todo, run_on_ray(todo, ray_address), strict=True):
            record(run, code)
    elif workers <= 1 and cli is not None:
        for run in todo:
            record(run, run_in_process(run, cli))
    elif workers <= 1:  # no entry given: one worker process at a time
        for run in todo:
            record(run, _log_run(run).returncode)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for run, done in zip(todo, pool.map(_log_run, todo), strict=True):
                record(run, done.returncode)
    return status


def run_on_ray(runs: list[Run], address: str) -> list[int]:
    """Each run as a Ray task of one CPU (`address`: a cluster's address, or "local" for a
    cluster started here); the nodes must share the output folder's file system."""
    try:
        import ray
    except ImportError as err:  # pragma: no cover - ray is in the test extra
        raise ValueError("--ray needs the package ray: pip install 'ray>=2.40'") from err

    started_here = not ray.is_initialized()
    if started_here:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address == "local":
            kwargs["num_cpus"] = max(1, os.cpu_count() or 1)
        else:
            kwargs["address"] = address
        pythonpath = os.environ.get("PYTHONPATH")
        if pythonpath:  # a source checkout: the workers import the same code
            kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": pythonpath}}
        ray.init(**kwargs)
    try:
        task = ray.remote(num_cpus=1)(_ray_task)
        return ray.get([task.remote(run) for run in runs])
    finally:
        if started_here:
            ray.shutdown()


def _ray_task(run: Run) -> int:
    return _log_run(run).returncode
