"""The main job: (cached) SFT warm start -> RL -> held-out evaluation -> summary."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console
from rich.table import Table

from policyopt import __version__
from policyopt.config.load import Config
from policyopt.config.resume_check import data_files
from policyopt.models.cache import cache_dir
from policyopt.models.loading import load_model, load_model_config, load_tokenizer
from policyopt.models.precision import set_precision
from policyopt.models.threads import apply_num_threads
from policyopt.tasks.base import Task, get_task, task_class
from policyopt.tasks.ranking import RankingTask
from policyopt.train.held_out import eval_rows
from policyopt.train.policy import load_policy
from policyopt.train.prompts import check_chat_template, check_positions
from policyopt.train.sft import run_sft, sft_data_digest
from policyopt.train.trainer import Trainer, seed_everything


def sft_cache_key(config: Config) -> str:
    """Everything the SFT result depends on."""
    # A task whose demonstrations may hold an environment's text overrides `Task.sft_segments`
    # (SFT masks that text out of its loss): an entry only for such a task, so that the keys
    # of every other task's earlier warm starts still hold.
    segmented = task_class(config.task.name).sft_segments is not Task.sft_segments
    # A task that reads the user's files: the rows SFT trains on, by content, since the
    # options hold only the files' paths, and an edited solutions file (even at the same
    # size and modification time) is another warm start. Only for such a task, so that the
    # keys of the embedded tasks' earlier warm starts still hold.
    data = (
        sft_data_digest(get_task(config.task.name, **config.task.options))
        if data_files(config)
        else None
    )
    payload = {
        "version": __version__,
        "model": config.model.name_or_path,
        "dtype": config.model.dtype,
        "chat": config.model.chat_template,
        "task": config.task.model_dump(mode="json"),
        "sft": config.sft.model_dump(mode="json"),
        "seed": sft_seed(config),
        # Only when not the default, so that the keys of earlier fp32 warm starts still hold.
        **({"precision": config.model.precision} if config.model.precision != "fp32" else {}),
        **({"sft_segments": "environment_masked"} if segmented else {}),
        **({"data": data} if data else {}),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def sft_seed(config: Config) -> int:
    """The SFT warm start's seed: train.sft_seed, else train.seed."""
    return config.train.seed if config.train.sft_seed is None else config.train.sft_seed


def fine_tune(config: Config, console: Console | None = None) -> tuple[Any, Any, dict[str, float]]:
    """Load the configured model and run SFT on the task's expert solutions (no caching)."""
    seed = sft_seed(config)
    seed_everything(seed)
    model, tok = load_model(
        config.model.name_or_path,
        dtype=config.model.dtype,
        device=config.model.device,
        trust_remote_code=config.model.trust_remote_code,
    )
    set_precision(model, config.model.precision)
    check_chat_template(config, tok)  # before minutes of SFT
    apply_num_threads(config.train.num_threads, model)  # SFT threads as RL's (train.num_threads)
    task = get_task(config.task.name, **config.task.options)
    metrics = run_sft(
        model,
        tok,
        task,
        config.sft,
        seed=seed,
        chunk_size=config.model.logit_chunk_size,
        chat=config.model.chat_template,
        console=console,
        progress=config.train.progress,
        # The files the rows come from, for a message that names a row.
        data=", ".join(f"{key}={path}" for key, path in data_files(config).items()),
    )
    return model, tok, metrics


def warm_started_policy(config: Config, console: Console) -> tuple[Any, Any, dict[str, float]]:
    """The model after SFT on the task's expert solutions, built once per SFT setting and
    cached (atomically) under the policyopt cache folder."""
    cfg = config
    if cfg.sft.steps == 0:
        # A ranking policy is initialised at random here: from the run's seed, not from
        # whatever an earlier run in this process (compare) left in the global RNG.
        seed_everything(cfg.train.seed)
        model, tok = load_policy(cfg.model, get_task(cfg.task.name, **cfg.task.options))
        return model, tok, {}
    cached = cache_dir() / "sft" / sft_cache_key(cfg)
    if (cached / "sft_metrics.json").exists():
        model, tok = load_model(
            str(cached),
            dtype=cfg.model.dtype,
            device=cfg.model.device,
            trust_remote_code=cfg.model.trust_remote_code,
        )
        console.print(f"SFT warm start from cache {cached}")
        return model, tok, json.loads((cached / "sft_metrics.json").read_text())
    check_rl_positions(cfg)  # before minutes of SFT, not after them
    model, tok, metrics = fine_tune(cfg, console)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.parent / f".tmp-{cached.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "sft_metrics.json").write_text(json.dumps(metrics))
    try:
        os.rename(tmp, cached)
    except OSError:  # another process cached the same setting first
        shutil.rmtree(tmp, ignore_errors=True)
    return model, tok, metrics


def check_rl_positions(config: Config) -> None:
    """The check the trainer makes at its start (a prompt plus the response budget within
    the model's positions), from the model's config and tokenizer alone."""
    task = get_task(config.task.name, **config.task.options)
    if task.policy != "lm":
        return
    name, trust = config.model.name_or_path, config.model.trust_remote_code
    model = SimpleNamespace(config=load_model_config(name, trust_remote_code=trust))
    tok = load_tokenizer(name, trust_remote_code=trust)
    check_positions(model, tok, task, "train", task.rows("train"), config)
    check_positions(model, tok, task, "eval", eval_rows(task, config.eval.size), config)


def run_pipeline(config: Config, console: Console | None = None) -> dict[str, Any]:
    """SFT (cached) -> evaluate -> RL -> evaluate; writes summary.json in the output dir."""
    console = console or Console()
    start = time.perf_counter()
    say = phase_printer(console)
    if config.sft.steps:
        say(
            f"SFT warm start of {config.model.name_or_path}: up to {config.sft.steps} steps of "
            f"{config.sft.batch_size} expert solutions (cached after the first run)"
        )
    else:
        say(f"no SFT warm start (sft.steps is 0): RL starts from {config.model.name_or_path}")
    model, tok, sft_metrics = warm_started_policy(config, console)
    t_sft = time.perf_counter() - start
    trainer = Trainer(config, model=model, tokenizer=tok, console=console)
    eval_seconds = 0.0
    try:
        if trainer.step == 0:
            say(f"held-out evaluation before RL: {len(trainer.eval_rows)} problems, greedy")
            t0 = time.perf_counter()
            initial = trainer.evaluate()
            eval_seconds += time.perf_counter() - t0
        else:
            initial = _stored_initial(trainer.output_dir)
        (trainer.output_dir / "initial_eval.json").write_text(json.dumps(initial))
        trainer.logger.log_eval(trainer.step, "eval_before_rl", initial)
        r = config.rollout
        say(
            f"RL: {config.train.steps - trainer.step} steps of {config.algorithm.name}, "
            f"{r.prompts_per_step} prompts x {r.group_size} samples of up to "
            f"{r.max_new_tokens} tokens per step, {trainer.num_threads} thread(s)"
        )
        t_rl = time.perf_counter()
        last = trainer.train()
        rl_seconds = time.perf_counter() - t_rl
        say(f"held-out evaluation after RL: {len(trainer.eval_rows)} problems, greedy")
        t0 = time.perf_counter()
        final = trainer.evaluate()
        eval_seconds += time.perf_counter() - t0
        trainer.logger.log_eval(trainer.step, "eval_after_rl", final)
    finally:
        trainer.close()
    summary = {
        "recipe": config.algorithm.name,
        "seed": config.train.seed,
        "initial_accuracy": initial["eval/accuracy"],
        "final_accuracy": final["eval/accuracy"],
        "initial_eval": initial,
        "final_eval": final,
        "sft": sft_metrics,
        "rl_steps": trainer.step,
        "rl_seconds": rl_seconds,
        "wall_seconds": time.perf_counter() - start,
        "last_step_metrics": last,
        # The final greedy evaluation rollouts: median length in tokens and median number of
        # HISPO segments (the run's hispo_segments options, else the paper's).
        "median_response_tokens": final.get("eval/response_tokens_median"),
        "segments_per_response": final.get("eval/segments_per_response_median"),
        "output_dir": str(trainer.output_dir),
        **baseline_summary(config, trainer.task, initial, final, console),
    }
    (trainer.output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(summary_table(summary))
    console.print(
        f"total time {_minutes(summary['wall_seconds'])} (SFT {_minutes(t_sft)}, RL "
        f"{_minutes(rl_seconds)}, evaluation {_minutes(eval_seconds)})",
        highlight=False,
        soft_wrap=True,
    )
    return summary


def baseline_summary(
    config: Config, task: Any, initial: dict[str, float], final: dict[str, float], console: Console
) -> dict[str, Any]:
    """A ranking task's reference rankers (LambdaRank, the oracle) beside the policy; {} for
    any other task. Imported here so that only ranking runs load the ranking environment."""
    if not isinstance(task, RankingTask):
        return {}
    from policyopt.envs.ltr.summary import ranking_summary

    return ranking_summary(config, task, initial, final, console)


def headline(summary: dict[str, Any], out: str) -> str:
    """The command's one line: held-out accuracy and mean reward before and after RL, or
    for a ranking run NDCG@10 and the reference rankers."""
    if "final_ndcg@10" in summary:
        return ranking_line(summary, out)
    gain = summary["final_accuracy"] - summary["initial_accuracy"]
    before, after = summary["initial_eval"]["eval/reward"], summary["final_eval"]["eval/reward"]
    return (
        f"held-out greedy accuracy {summary['initial_accuracy']:.3f} -> "
        f"{summary['final_accuracy']:.3f} ({gain:+.3f}), mean reward {before:.3f} -> "
        f"{after:.3f} ({after - before:+.3f}); summary: {out}/summary.json"
    )


def ranking_line(summary: dict[str, Any], out: str) -> str:
    """Held-out NDCG@10 before/after RL and the references, for a ranking run."""
    before, after = summary["initial_ndcg@10"], summary["final_ndcg@10"]
    refs = [
        f"{name} {summary[key]:.3f}"
        for name, key in (
            ("oracle", "oracle_ndcg@10"),
            ("LambdaRank", "lambdarank_ndcg@10"),
            ("listwise softmax (full labels)", "listwise_softmax_ndcg@10"),
        )
        if summary.get(key) is not None
    ]
    return (
        f"held-out NDCG@10 {before:.3f} -> {after:.3f} ({after - before:+.3f}); "
        f"{'; '.join(refs)}; summary: {out}/summary.json"
    )


def phase_printer(console: Console) -> Any:
    """`say(text)`: one line per phase, with the time since the first."""
    start = time.perf_counter()

    def say(text: str) -> None:
        elapsed = _minutes(time.perf_counter() - start)
        # soft_wrap: one line per phase in a log file too, not broken at 80 columns
        console.print(f"[{elapsed}] {text} ...", markup=False, highlight=False, soft_wrap=True)

    return say


def _minutes(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60} min {s % 60:02d} s"


def _stored_initial(output_dir: Path) -> dict[str, float]:
    path = output_dir / "initial_eval.json"
    if not path.exists():
        raise FileNotFoundError(f"resuming {output_dir}: initial_eval.json is missing")
    return json.loads(path.read_text())


def table_keys(initial: dict[str, float], final: dict[str, float]) -> list[str]:
    """The evaluation rows worth reading: a `reward` row that only repeats its `accuracy`
    row (a 0/1 task check) and the per-group style shares (the overall ones stay) left out."""
    keys = []
    for key in initial:
        twin = key.removesuffix("reward") + "accuracy"
        same = (
            key.endswith("reward")
            and twin in initial
            and initial[key] == initial[twin]
            and final.get(key) == final.get(twin)
        )
        per_group_style = "/style/" in key and key.count("/") > 2
        if not (same or per_group_style):
            keys.append(key)
    return keys


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"{summary['recipe']} (seed {summary['seed']}): held-out evaluation")
    table.add_column("metric")
    table.add_column("before RL (SFT)" if summary.get("sft") else "before RL", justify="right")
    table.add_column("after RL", justify="right")
    for key in table_keys(summary["initial_eval"], summary["final_eval"]):
        before = summary["initial_eval"][key]
        after = summary["final_eval"].get(key, float("nan"))
        table.add_row(key.removeprefix("eval/"), f"{before:.3f}", f"{after:.3f}")
    table.add_row("wall time (s)", "", f"{summary['wall_seconds']:.0f}")
    return table
