"""Where metrics go: JSONL always, TensorBoard, W&B and MLflow on request; a rich progress bar."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class MetricsLogger:
    """Writes one record per step to every configured sink."""

    def __init__(
        self,
        output_dir: str | Path,
        loggers: list[str],
        config: dict[str, Any],
        *,
        resume_step: int = 0,
    ) -> None:
        """`resume_step`: the step the run continues from; TensorBoard hides what an earlier
        (killed) run logged past it, as `truncate_after` does for the JSONL files."""
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / "metrics.jsonl"
        self.samples = self.dir / "samples.jsonl"
        self._tb = None
        self._wandb = None
        self._mlflow = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tensorboard"), purge_step=resume_step + 1)
        if "wandb" in loggers:
            wandb = _optional("wandb")
            self._wandb = wandb.init(project="policyopt", dir=str(self.dir), config=config)
        if "mlflow" in loggers:
            self._mlflow = _optional("mlflow")
            self._mlflow.start_run()
            self._mlflow.log_params(_flatten(config))

    def truncate_after(self, step: int) -> int:
        """On resume, forget records of steps the killed run logged past its checkpoint, and
        lines torn by a kill or a full disk mid-append. Returns how many torn lines it dropped.

        Rewritten to a temporary file and renamed over the old one: a kill here loses nothing.
        """
        torn = 0
        for path in (self.jsonl, self.samples):
            if not path.exists():
                continue
            records, bad = _parse_lines(path.read_text())
            torn += bad
            kept = [line for line, record in records if record.get("step", 0) <= step]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, path)
        return torn

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.jsonl.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        numeric = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "step"}
        self._to_dashboards(numeric, step)

    def _to_dashboards(self, numeric: dict[str, float], step: int) -> None:
        """Scalars to every configured dashboard (TensorBoard, W&B, MLflow)."""
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics(numeric, step=step)

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        with self.samples.open("a") as fh:
            for s in samples:
                fh.write(json.dumps({"step": step, **s}) + "\n")
        if self._tb is not None and samples:
            text = "\n\n".join("\n".join(f"**{k}**: `{v}`" for k, v in s.items()) for s in samples)
            self._tb.add_text("samples", text, step)
            self._tb.flush()

    def log_eval(self, step: int, tag: str, metrics: dict[str, float]) -> None:
        """A held-out evaluation outside the step records (before / after RL) to the
        dashboards as `<tag>/<metric>` (metrics.jsonl keeps one record per step; the
        pipeline writes these to initial_eval.json and summary.json)."""
        numeric = {
            f"{tag}/{k.removeprefix('eval/')}": float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and math.isfinite(v)
        }
        self._to_dashboards(numeric, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL log, skipping lines torn by a kill mid-append."""
    p = Path(path)
    if not p.exists():
        return []
    return [record for _, record in _parse_lines(p.read_text())[0]]


def _parse_lines(text: str) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """(line, record) for each line holding a JSON object, and how many lines did not."""
    parsed, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            parsed.append((line, record))
        else:
            bad += 1
    return parsed, bad


def progress_bar(
    console: Console | None = None,
    enabled: bool = True,
    interval: float | None = None,
    plain: bool = False,
) -> Progress | PlainProgress:
    """A live bar on a terminal; where output goes to a file or pipe (nohup, CI, Slurm), or
    with `plain` (a phase that may run under another bar: evaluation inside training), a
    plain line every `interval` seconds (default `$POLICYOPT_PROGRESS_INTERVAL` or 30) with
    steps, elapsed time and the estimated time remaining."""
    console = console or Console()
    if enabled and (plain or not console.is_terminal):
        if interval is None:
            interval = float(os.environ.get("POLICYOPT_PROGRESS_INTERVAL", "30"))
        return PlainProgress(console, interval)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
    )


class PlainProgress:
    """`rich.progress.Progress`'s add_task / update as plain lines for a non-terminal:

        sft 120/1000 (12%), 0:01:02 elapsed, about 0:08:05 left; loss 0.1234

    printed on the first update, then at most every `interval` seconds, and at the end.
    The estimate is the mean time per step so far (of this process: a resumed run's earlier
    steps are not counted) times the steps left."""

    def __init__(self, console: Console, interval: float, clock: Any = time.monotonic) -> None:
        self.console, self.interval, self.clock = console, interval, clock
        self.tasks: list[dict[str, Any]] = []

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(
        self, description: str, total: float | None = None, completed: float = 0, **fields: Any
    ) -> int:
        now = self.clock()
        self.tasks.append(
            {
                "description": description,
                "total": total,
                "completed": completed,
                "first": completed,
                "start": now,
                "printed": None,
                "status": fields.get("status", ""),
            }
        )
        return len(self.tasks) - 1

    def update(
        self, task_id: int, *, completed: float | None = None, advance: float = 0, **fields: Any
    ) -> None:
        task = self.tasks[task_id]
        task["completed"] = task["completed"] + advance if completed is None else completed
        if "status" in fields:
            task["status"] = fields["status"]
        now = self.clock()
        done = task["total"] is not None and task["completed"] >= task["total"]
        due = task["printed"] is None or now - task["printed"] >= self.interval
        if due or done:
            task["printed"] = now
            self.console.print(self.line(task, now), markup=False, highlight=False)

    @staticmethod
    def line(task: dict[str, Any], now: float) -> str:
        elapsed = now - task["start"]
        done, total = task["completed"], task["total"]
        head = f"{task['description']} {done:g}"
        if total:
            head += f"/{total:g} ({100 * done / total:.0f}%)"
        head += f", {_clock(elapsed)} elapsed"
        steps = done - task["first"]
        if total and steps > 0 and done < total:
            head += f", about {_clock(elapsed / steps * (total - done))} left"
        return head + (f"; {task['status']}" if task["status"] else "")


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _optional(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        raise ImportError(
            f"the '{name}' logger needs the {name} package: pip install 'policyopt[log]'"
        ) from None


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:250]
    return out
