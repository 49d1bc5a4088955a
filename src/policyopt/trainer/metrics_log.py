"""Where metrics go: JSONL always, TensorBoard, W&B and MLflow on request; a rich progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class MetricsLogger:
    """Writes one record per step to every configured sink."""

    def __init__(self, output_dir: str | Path, loggers: list[str], config: dict[str, Any]) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / "metrics.jsonl"
        self.samples = self.dir / "samples.jsonl"
        self._tb = None
        self._wandb = None
        self._mlflow = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tensorboard"))
        if "wandb" in loggers:
            wandb = _optional("wandb")
            self._wandb = wandb.init(project="policyopt", dir=str(self.dir), config=config)
        if "mlflow" in loggers:
            self._mlflow = _optional("mlflow")
            self._mlflow.start_run()
            self._mlflow.log_params(_flatten(config))

    def truncate_after(self, step: int) -> None:
        """On resume, forget records of steps the killed run logged past its checkpoint."""
        for path in (self.jsonl, self.samples):
            if path.exists():
                kept = [
                    line
                    for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= step
                ]
                path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.jsonl.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        numeric = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "step"}
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

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def progress_bar(console: Console | None = None, enabled: bool = True) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
    )


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
