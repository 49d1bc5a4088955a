"""`policyopt quickstart dmrl`: LRP first, then the editor's warm start and DRPO, then the
true long-term value of the deployed configuration.

1. Offline history: `task.options.history` A/B experiments with true 7-day labels (4 per
   day); the first 80% (by day) train the LRP, the last 20% are held out. The LRP and the
   surrogate index are compared there (Spearman, MSE of the 7-day effect). The LRP's memory
   bank holds the whole history; a held-out target sees only experiments matured before it
   started.
2. The LRP is frozen and saved (`<output_dir>/lrp`); the live task reads it from there.
3. SFT warm start on the scripted editor's edits (cached like every recipe's SFT).
4. RL with the configured method: each step is one day of the live environment. With the
   editor as an episode (`rollout.strategy: multi_turn` with the `dmrl_editor`
   environment, recipe `dmrl_episode`; `policyopt.envs.ads.episode`) the environment is
   bound to the run's live world, each sample an episode of up to `max_turns` edits.
5. Summary: `initial_long_term_value` is the true 7-day value per user (simulator
   expectation, the platform's fixed evaluation users) of the starting document's
   configuration; `final_long_term_value` that of the deployed configuration after the last
   step: the best so far by the LRP's predicted lifts, which is what the live system runs.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from policyopt.config.load import Config
from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import make_history
from policyopt.envs.ads.episode import EDITOR, EditorEnvironment, episode_token_budget
from policyopt.envs.ads.lrp.features import build_bank
from policyopt.envs.ads.lrp.io import save_lrp
from policyopt.envs.ads.lrp.surrogate import SurrogateIndex
from policyopt.envs.ads.lrp.train import (
    LRPTrainConfig,
    evaluate_effects,
    predicted_arm_values,
    train_lrp,
)
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT, edit_token_budget
from policyopt.envs.ads.skilldoc.task import DEFAULT_LIVE_USERS, DEFAULT_WORLD, DEMO_VERSION
from policyopt.models.cache import cache_dir
from policyopt.models.loading import load_tokenizer
from policyopt.models.threads import apply_num_threads
from policyopt.models.tiny import build_char_tokenizer, embedded_size
from policyopt.pipelines.quickstart import warm_started_policy
from policyopt.rollout.multiturn import environment_of, multi_turn
from policyopt.store import run_folder
from policyopt.train.trainer import Trainer

PER_DAY = 4
TRAIN_SHARE = 0.8
LAST_STEPS = 10  # proposal_true_lift averages the editor's last LAST_STEPS days


def check_token_budget(
    max_new_tokens: int, tokenizer: object, margin: int, turns: int | None = None
) -> int:
    """The budget the editor needs (one edit, or an episode of `turns` edits and the
    replies between them); a clear error if `rollout.max_new_tokens` is below it."""
    if turns is None:
        need, what = edit_token_budget(tokenizer, margin), "the longest demonstration edit"
    else:
        need = episode_token_budget(tokenizer, turns, margin)
        what = f"{turns} of the longest demonstration edits with the replies between them"
    if max_new_tokens < need:
        raise ValueError(
            f"dmrl: rollout.max_new_tokens={max_new_tokens} cannot hold {what} plus "
            f"task.options.token_margin={margin} ({need} tokens with this tokenizer); cut "
            f"edits are never applied, so set rollout.max_new_tokens={need}"
        )
    return need


def episode_turns(config: Config) -> int | None:
    """K when the run's editor is an episode (`rollout.strategy: multi_turn` with the
    `dmrl_editor` environment: up to `max_turns` edits); None for one edit per step. Such a
    run cannot decode under the edit grammar (its state does not span the replies): refused
    here, before the predictor and the warm start."""
    ro = config.rollout
    if ro.strategy != "multi_turn" or ro.strategy_options.get("environment") != EDITOR:
        return None
    if ro.engine_options.get("grammar") is not None:
        raise ValueError(
            f"dmrl: the {EDITOR} episodes cannot decode under the edit grammar "
            f"(rollout.engine_options.grammar={ro.engine_options['grammar']!r}): the "
            "multi_turn strategy refuses a grammar-constrained engine; set "
            "rollout.engine_options.grammar=null"
        )
    default = inspect.signature(multi_turn).parameters["max_turns"].default
    return int(ro.strategy_options.get("max_turns", default))


def bind_episodes(config: Config, task: Any, turns: int) -> None:
    """Hand the run's live world to its `dmrl_editor` environment (the instance the
    multi_turn strategy builds for these options)."""
    options = config.rollout.strategy_options
    env = environment_of(EDITOR, options.get("environment_options"))
    assert isinstance(env, EditorEnvironment)
    env.bind(task.env, turns)


def proposal_summary(log: list[dict[str, Any]], last: int = LAST_STEPS) -> dict[str, float]:
    """The summary's proposal statistics from the environment's day records."""
    # status fractions over the edits proposed: an episode's turns, else the proposals
    n = sum(r.get("turns", r["proposals"]) for r in log)
    tail = log[-last:]

    def mean(key: str) -> float:
        vals = [r[key] for r in tail if key in r]
        return float(sum(vals) / len(vals)) if vals else float("nan")

    return {
        "proposal_true_lift": mean("true_lift"),
        "random_proposal_true_lift": mean("random_true_lift"),
        "truncated_fraction": sum(r["truncated"] for r in log) / n if n else float("nan"),
        "malformed_fraction": sum(r["malformed"] for r in log) / n if n else float("nan"),
    }


def cached_lrp(options: dict[str, Any], out: Path) -> dict[str, float]:
    """`train_and_evaluate_lrp`, cached (atomically) per setting under the policyopt cache:
    the ablation's methods share one seed's LRP, as they share its SFT warm start."""
    keys = ("seed", "users_per_arm", "history", "lrp", "world", "live_users")
    # "labels": version of the simulator's truth (2: causal effect over all users; 3: the
    # 14 parameters and the live world)
    values = {"labels": 3, **{k: options.get(k) for k in keys}}
    payload = json.dumps(values, sort_keys=True, default=str)
    cached = cache_dir() / "dmrl_lrp" / hashlib.sha256(payload.encode()).hexdigest()[:16]
    if not (cached / "metrics.json").exists():
        tmp = cached.parent / f".tmp-{cached.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        metrics = train_and_evaluate_lrp(options, tmp)
        (tmp / "metrics.json").write_text(json.dumps(metrics))
        try:
            os.rename(tmp, cached)
        except OSError:  # another process cached the same setting first
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(cached, out, dirs_exist_ok=True)
    return json.loads((cached / "metrics.json").read_text())


def platform_for(options: dict[str, Any]) -> AdPlatform:
    """A fresh platform (day 0) of the task options' seed, arm size and world (the task's
    defaults: `SkillDocTask`)."""
    return AdPlatform(
        int(options.get("seed", 0)),
        users_per_arm=int(options.get("users_per_arm", 300)),
        world=str(options.get("world", DEFAULT_WORLD)),
        live_users=int(options.get("live_users", DEFAULT_LIVE_USERS)),
    )


def train_and_evaluate_lrp(options: dict[str, Any], out: Path) -> dict[str, float]:
    """Steps 1-2: history, LRP vs surrogate on held-out experiments, LRP saved to `out`."""
    seed = int(options.get("seed", 0))
    platform = platform_for(options)
    history = make_history(platform, int(options.get("history", 400)), PER_DAY, seed)
    cut = int(len(history) * TRAIN_SHARE)
    train, held_out = history[:cut], history[cut:]
    cfg = LRPTrainConfig(**{"seed": seed, **options.get("lrp", {})})
    model, metrics = train_lrp(train, cfg)
    bank = build_bank(history, float(model.y_mean), float(model.y_std))
    v = predicted_arm_values(model, held_out, bank)
    lrp = evaluate_effects(v[:, 1] - v[:, 0], held_out)
    sur = evaluate_effects(SurrogateIndex().fit(train).predict(held_out), held_out)
    save_lrp(out, model, bank)
    return {
        **metrics,
        "lrp_spearman": lrp["spearman"],
        "lrp_mse": lrp["mse"],
        "surrogate_spearman": sur["spearman"],
        "surrogate_mse": sur["mse"],
        "history_experiments": float(len(history)),
        "held_out_experiments": float(len(held_out)),
        "first_online_day": float(history[-1].start_day + 1),
    }


def _tokenizer_for(config: Config) -> Any:
    """The editor's tokenizer (for the budget check, before any model is trained)."""
    if embedded_size(config.model.name_or_path) is not None:
        return build_char_tokenizer()
    return load_tokenizer(
        config.model.name_or_path, trust_remote_code=config.model.trust_remote_code
    )


def live_options(config: Config, out: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """The seed's LRP, cached and copied to `<out>/lrp`, and the live task's options that
    read it (online from the day after the LRP's history); the run and the editor study's
    random arm build their live task from these."""
    options = dict(config.task.options)
    options.setdefault("seed", config.train.seed)
    lrp = cached_lrp(options, out / "lrp")
    live = {
        **options,
        "mode": "live",
        "lrp_path": str(out / "lrp"),
        "first_day": int(lrp["first_online_day"]),
    }
    return live, lrp


def headline(s: dict[str, Any], out: str) -> str:
    """The command's one line: the deployed configuration's true long-term value before and
    after, and the predictors' held-out rank correlations."""
    return (
        f"true 7-day value per user of the deployed configuration "
        f"{s['initial_long_term_value']:.4f} -> {s['final_long_term_value']:.4f} "
        f"({s['relative_gain'] * 100:+.2f}%); held-out 7-day effect Spearman: LRP "
        f"{s['lrp_spearman']:.3f}, surrogate index {s['surrogate_spearman']:.3f}; "
        f"summary: {out}/summary.json"
    )


def run_dmrl_pipeline(config: Config, console: Console | None = None) -> dict[str, Any]:
    """The predictor, the editor's warm start, DRPO over live days, the deployed value; the
    output folder is claimed as the run's first (it holds the predictor before the trainer
    starts: `store/run_folder.py`)."""
    out = run_folder.claim(config.train.output_dir)
    try:
        summary = _run(config, console or Console())
    except BaseException:
        run_folder.release(out, abandon=True)
        raise
    run_folder.release(out)
    return summary


def _run(config: Config, console: Console) -> dict[str, Any]:
    start = time.perf_counter()
    # Before SFT too; "auto" for the DMRL editor's small model (policyopt.models.threads).
    apply_num_threads(config.train.num_threads, None)
    out = Path(config.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    options = dict(config.task.options)
    options.setdefault("seed", config.train.seed)
    t0 = time.perf_counter()
    turns = episode_turns(config)
    probe_tok = _tokenizer_for(config)
    budget = check_token_budget(
        config.rollout.max_new_tokens, probe_tok, int(options.get("token_margin", 8)), turns
    )
    live, lrp = live_options(config, out)
    lrp["lrp_seconds"] = time.perf_counter() - t0  # near 0 when cached
    console.print(
        f"LRP Spearman {lrp['lrp_spearman']:.3f} vs surrogate {lrp['surrogate_spearman']:.3f} "
        f"on {int(lrp['held_out_experiments'])} held-out experiments"
    )
    sft_config = copy.deepcopy(config)
    # One warm start for every seed (seed 0's demonstrations and SFT): seeds vary the
    # history, the LRP, the environment and RL, and the runs of a comparison share a start.
    # demo_version enters the SFT cache key: a cache of older demonstrations is not reused
    sft_config.task.options = {
        **options,
        "mode": "demonstrations",
        "seed": 0,
        "demo_version": DEMO_VERSION,
    }
    sft_config.train.seed = 0
    model, tok, sft_metrics = warm_started_policy(sft_config, console)
    rl_config = copy.deepcopy(config)
    rl_config.task.options = live
    trainer = Trainer(rl_config, model=model, tokenizer=tok, console=console)
    try:
        task = trainer.task
        if turns is not None:
            bind_episodes(rl_config, task, turns)
        initial = task.value(START_DOCUMENT)  # type: ignore[attr-defined]
        t_rl = time.perf_counter()
        last = trainer.train()
        rl_seconds = time.perf_counter() - t_rl
    finally:
        trainer.close()
    env = task.env  # type: ignore[attr-defined]
    with (out / "dmrl_days.jsonl").open("w") as f:
        for record in env.log:
            f.write(json.dumps(record) + "\n")
    agent_stats = getattr(env.agent, "stats", None)
    summary = {
        "recipe": config.algorithm.name,
        "advantage": config.algorithm.advantage,
        "advantage_options": config.algorithm.advantage_options,
        "seed": config.train.seed,
        "world": task.platform.world,  # type: ignore[attr-defined]
        "initial_long_term_value": initial,
        "final_long_term_value": task.value(env.document),  # type: ignore[attr-defined]
        "lrp_spearman": lrp["lrp_spearman"],
        "surrogate_spearman": lrp["surrogate_spearman"],
        "lrp": lrp,
        "final_document": env.document.render(),
        "final_parameters": env.control.as_dict(),
        "deployments": len(env.deployed_days),
        **proposal_summary(env.log),
        "edit_token_budget": budget,
        **({"episode_turns": turns} if turns is not None else {}),
        "lower_agent": agent_stats() if callable(agent_stats) else "rule",
        "sft": sft_metrics,
        "rl_steps": trainer.step,
        "rl_seconds": rl_seconds,
        "wall_seconds": time.perf_counter() - start,
        "last_step_metrics": last,
        "output_dir": str(out),
    }
    summary["relative_gain"] = (
        summary["final_long_term_value"] / summary["initial_long_term_value"] - 1.0
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
