"""The training loop: rollout -> rewards -> shaping -> filter -> advantages -> update, with resume.

The loop knows the plug points by name only (engines, reward functions, shapers, filters,
advantage estimators, losses); methods are registered parts and presets, not subclasses.
"""

from __future__ import annotations

import copy
import gc
import os
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from policyopt.core import ADVANTAGES, compute_advantages
from policyopt.core.structure import check_declared_made, check_produced, gather
from policyopt.core.tis import DEFAULT_TIS_CAP
from policyopt.models.lora import apply_lora, disabled_adapter
from policyopt.models.threads import apply_num_threads
from policyopt.rewards.functions import RewardPipeline, build_reward_pipeline
from policyopt.rewards.shaping import SHAPERS, ShapingContext
from policyopt.rollout.base import ENGINES
from policyopt.tasks.base import get_task
from policyopt.trainer import checkpoint as ckpt
from policyopt.trainer import dist_checkpoint
from policyopt.trainer.batch import StepBatch
from policyopt.trainer.config import Config, dump_config
from policyopt.trainer.data import PromptSampler
from policyopt.trainer.distributed import (
    full_weights,
    global_advantages,
    rank_device,
    rank_slice,
    reduce_metrics,
    setup,
    share,
    wrap_policy,
)
from policyopt.trainer.evaluate import eval_rows, evaluate
from policyopt.trainer.metrics_log import MetricsLogger, progress_bar, read_metrics
from policyopt.trainer.optim import build_optimizer
from policyopt.trainer.plot import plot_metrics
from policyopt.trainer.policy import load_policy
from policyopt.trainer.resume_check import check_resume_config
from policyopt.trainer.rollout_phase import RolloutTimes, Scored, collect_batch, generate_and_score
from policyopt.trainer.structure import check_config_structure, step_structure
from policyopt.trainer.update import NonFiniteUpdateError, UpdateContext, policy_update


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    def __init__(
        self,
        config: Config,
        *,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        console: Console | None = None,
    ) -> None:
        self.config = cfg = config
        check_config_structure(cfg)  # before any model is loaded (load_config checks it too)
        self.console = console or Console()
        # Data parallelism under torchrun (trainer.distributed); one process: rank 0 of 1.
        self.dist = setup(cfg.train.parallel, cfg.model.device)
        self.share = share(cfg.rollout.prompts_per_step, self.dist)
        seed_everything(cfg.train.seed)
        self.output_dir = Path(cfg.train.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        # Which checkpoint to continue, checked against its config before anything is
        # written; rank 0 repairs and decides, the other ranks follow.
        self.resume_from = self.dist.broadcast(self._resume_point() if self.dist.is_main else None)
        if self.dist.is_main:
            _write_atomically(self.output_dir / "config.yaml", dump_config(cfg))
        self.task = get_task(cfg.task.name, **cfg.task.options)
        self.train_rows = self.task.rows("train")
        self.eval_rows = eval_rows(self.task, cfg.eval.size)
        if model is None:
            device = rank_device(cfg.model.device, self.dist)
            model, tokenizer = load_policy(
                cfg.model.model_copy(update={"device": device}), self.task
            )
        if cfg.model.lora.enabled:
            lora = cfg.model.lora
            model = apply_lora(
                model,
                rank=lora.rank,
                alpha=lora.alpha,
                target_modules=lora.target_modules,
                dropout=lora.dropout,
            )
        self.model, self.tokenizer = model, tokenizer
        self.num_threads = apply_num_threads(cfg.train.num_threads, model)  # "auto": by size
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self.engine = ENGINES.get(cfg.rollout.engine)(
            model, tokenizer, batch_size=cfg.rollout.batch_size, **cfg.rollout.engine_options
        )
        self.reward_fn: RewardPipeline = build_reward_pipeline(
            [(f.name, f.weight) for f in cfg.reward.functions],
            self.task,
            remote={
                f.name: cfg.reward.workers.model_dump() for f in cfg.reward.functions if f.remote
            },
        )
        self.shapers = [SHAPERS.get(s.name)(**s.options) for s in cfg.reward.shapers]
        # The reference policy is copied before wrapping (FSDP2 shards the policy in place).
        ref_model = None
        if cfg.algorithm.kl_coef > 0 and not cfg.model.lora.enabled:
            ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        logp_options = {
            "temperature": cfg.rollout.temperature,
            "chunk_size": cfg.model.logit_chunk_size,
        }
        self.policy = wrap_policy(model, self.dist, **logp_options)
        self.ref_policy = (
            wrap_policy(ref_model, self.dist, trainable=False, **logp_options)
            if ref_model is not None
            else None
        )
        params = [p for p in model.parameters() if p.requires_grad]
        updates_per_step = cfg.algorithm.ppo_epochs * cfg.algorithm.minibatches
        self.optimizer, self.scheduler = build_optimizer(
            params, cfg.optim, cfg.train.steps * updates_per_step
        )
        self.sampler = PromptSampler(len(self.train_rows), cfg.train.seed)
        self.update_ctx = self._update_context(ref_model)
        self.step = 0
        self.generated_tokens = 0  # over the whole run, for train.max_generated_tokens
        # Logs, samples and plots come from rank 0 only.
        self.logger = MetricsLogger(
            self.output_dir,
            cfg.train.loggers if self.dist.is_main else [],
            cfg.model_dump(mode="json"),
            resume_step=ckpt.step_of(self.resume_from) if self.resume_from else 0,
        )
        self._maybe_resume()
        if self.dist.rank and self.resume_from is None:  # each rank samples its own responses
            seed_everything(cfg.train.seed * 1_000_003 + self.dist.rank)

    # ----------------------------------------------------------------- setup helpers
    def _update_context(self, ref_model: torch.nn.Module | None) -> UpdateContext:
        cfg = self.config
        ref_context = None
        if cfg.algorithm.kl_coef > 0 and cfg.model.lora.enabled:
            # The reference policy is the base model: the adapter switched off.
            ref_context = lambda: disabled_adapter(self.model)  # noqa: E731
        wrapped = self.dist.active
        return UpdateContext(
            self.model,
            self.optimizer,
            self.scheduler,
            cfg,
            ref_model,
            ref_context,
            tis_cap=resolve_tis_cap(cfg.algorithm.tis_cap, self.engine.exact_logprobs),
            dist=self.dist,
            policy=self.policy if wrapped else None,
            ref_policy=self.ref_policy if wrapped else None,
        )

    def _policy_module(self) -> torch.nn.Module:
        """The `PolicyForward` (unwrapped from DDP): its parameter names key the state."""
        return getattr(self.policy, "module", self.policy)

    def _resume_point(self) -> Path | None:
        """The checkpoint to continue from (None: start over), once what a killed save left
        is repaired and incomplete checkpoints are reported; its config must match ours."""
        resume = self.config.train.resume
        for note in ckpt.recover(self.output_dir):
            self.console.print(note)
        incomplete = ckpt.incomplete_checkpoints(self.output_dir)
        if incomplete:
            self.console.print(
                f"ignoring incomplete checkpoint(s) {', '.join(p.name for p in incomplete)} in "
                f"{ckpt.checkpoint_root(self.output_dir)}: no valid {ckpt.MARKER} marker (a save "
                "was interrupted, a file was truncated, or an older policyopt wrote it)"
            )
        if resume is None:
            return None
        if resume == "auto":
            path = ckpt.latest_checkpoint(self.output_dir)
            if path is None and incomplete:
                raise ValueError(
                    f"train.resume=auto: {self.output_dir} holds only incomplete checkpoints "
                    f"({', '.join(p.name for p in incomplete)}), so there is nothing to resume; "
                    "set train.resume=null to start over there (they are replaced as steps are "
                    "saved again), or choose another train.output_dir"
                )
        else:
            path = Path(resume)
            if not ckpt.is_complete(path):
                raise FileNotFoundError(
                    f"train.resume: {path} is not a complete checkpoint (no valid {ckpt.MARKER} "
                    "marker listing its files)"
                )
        if path is not None:
            changed = check_resume_config(path / ckpt.CONFIG_FILE, path, self.config)
            if changed:
                self.console.print(f"resuming anyway with changed {', '.join(changed)}")
        return path

    def _maybe_resume(self) -> None:
        path = self.resume_from
        if path is None:
            if self.dist.is_main:
                self._forget_logs_after(0)  # a run killed before its first checkpoint
            return
        # The state is refused before anything is touched if unsafe.
        state = dist_checkpoint.load(
            self.dist,
            path,
            model=self.model,
            policy=self._policy_module(),
            optimizer=self.optimizer,
            seed=self.config.train.seed,
        )
        self.engine.sync_weights()  # an engine with its own copy samples from the checkpoint
        self.scheduler.load_state_dict(state["scheduler"])
        self._apply_optim_config()
        self.sampler.load_state_dict(state["sampler"])
        for shaper, s in zip(self.shapers, state.get("shapers", []), strict=False):
            shaper.load_state_dict(s)
        self.task.load_state_dict(state.get("task", {}))
        self.step = state["step"]
        self.generated_tokens = state.get("generated_tokens", 0)
        nonfinite = state.get("nonfinite", {})
        self.update_ctx.nonfinite_in_a_row = nonfinite.get("in_a_row", 0)
        self.update_ctx.nonfinite_total = nonfinite.get("total", 0)
        if self.dist.is_main:
            self._forget_logs_after(self.step)
            self.console.print(f"resumed from {path} at step {self.step}")

    def _forget_logs_after(self, step: int) -> None:
        torn = self.logger.truncate_after(step)
        if torn:
            self.console.print(
                f"dropped {torn} torn line(s) from the JSONL logs (killed mid-write)"
            )

    def _apply_optim_config(self) -> None:
        """The optimizer's hyperparameters from the config, not the checkpoint: the same values
        unless resumed anyway with new ones. The lr follows the schedule from its position."""
        o = self.config.optim
        for group in self.optimizer.param_groups:
            group.update(betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, initial_lr=o.lr)
        self.scheduler.base_lrs = [o.lr] * len(self.optimizer.param_groups)
        factors = self.scheduler.lr_lambdas
        for group, base, factor in zip(
            self.optimizer.param_groups, self.scheduler.base_lrs, factors, strict=True
        ):
            group["lr"] = base * factor(self.scheduler.last_epoch)

    def save(self) -> Path:
        state = {
            "step": self.step,
            "generated_tokens": self.generated_tokens,
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "shapers": [s.state_dict() for s in self.shapers],
            "task": self.task.state_dict(),
            "nonfinite": {
                "in_a_row": self.update_ctx.nonfinite_in_a_row,
                "total": self.update_ctx.nonfinite_total,
            },
        }
        # Optimizer and RNG states are added there (sharded under FSDP2; every rank's RNG).
        return dist_checkpoint.save(
            self.dist,
            self.output_dir,
            self.step,
            model=self.model,
            policy=self._policy_module(),
            optimizer=self.optimizer,
            tokenizer=self.tokenizer,
            state=state,
            config_text=dump_config(self.config),
            keep_last=self.config.train.keep_last,
            save_merged=self.config.model.lora.save_merged,
        )

    # ----------------------------------------------------------------- the loop
    def train(self, until_step: int | None = None) -> dict[str, float]:
        """Train to `config.train.steps` (or stop early at `until_step`, saving there)."""
        cfg = self.config.train
        last = min(cfg.steps, until_step) if until_step is not None else cfg.steps
        final: dict[str, float] = {}
        with progress_bar(self.console, cfg.progress and self.dist.is_main) as bar:
            task_id = bar.add_task("train", total=cfg.steps, completed=self.step, status="")
            while self.step < last and not self.budget_spent():
                metrics = self.train_step()
                self.step += 1
                self.generated_tokens += int(metrics["generated_tokens"])
                metrics["generated_tokens_total"] = float(self.generated_tokens)
                if self.config.eval.every and self.step % self.config.eval.every == 0:
                    metrics.update(self.evaluate())
                halt = self._nonfinite_halt()
                if self.dist.is_main and (
                    self.step % cfg.log_every == 0 or self.step == last or halt
                ):
                    self.logger.log(self.step, metrics)
                if halt:
                    raise NonFiniteUpdateError(halt)
                if cfg.save_every and self.step % cfg.save_every == 0:
                    self.save()
                bar.update(task_id, completed=self.step, status=_status(metrics))
                final = metrics
        if cfg.save_every == 0 or self.step % cfg.save_every != 0:
            self.save()
        if cfg.plot and self.dist.is_main and (self.step == cfg.steps or self.budget_spent()):
            plot_metrics(
                read_metrics(self.logger.jsonl),
                self.output_dir / "curves.png",
                self.config.algorithm.name,
            )
        return final

    def _nonfinite_halt(self) -> str | None:
        """Why the run must stop (optim.max_nonfinite_updates skipped updates in a row), or
        None."""
        limit = self.config.optim.max_nonfinite_updates
        count = self.update_ctx.nonfinite_in_a_row
        if count < limit:
            return None
        latest = ckpt.latest_checkpoint(self.output_dir)
        return (
            f"stopped at step {self.step}: the loss or gradient was NaN or inf in {count} "
            f"optimizer updates in a row (optim.max_nonfinite_updates={limit}). Each was "
            "skipped, so the parameters are those of the last finite update. Check reward "
            "functions and shapers for NaN/inf, or lower optim.lr; "
            + (f"the latest checkpoint is {latest}." if latest else "no checkpoint was saved.")
        )

    def budget_spent(self) -> bool:
        """Whether train.max_generated_tokens (if set) has been reached."""
        budget = self.config.train.max_generated_tokens
        return bool(budget) and self.generated_tokens >= budget

    def train_step(self) -> dict[str, float]:
        cfg = self.config
        # Reward functions see TRL's trainer_state: the optimizer steps done so far.
        self.reward_fn.trainer_state.global_step = self.step
        self.reward_fn.trainer_state.max_steps = cfg.train.steps
        t_start = time.perf_counter()
        times = RolloutTimes()
        world = self.dist.world
        with full_weights(self.policy):  # FSDP2: sample from whole layers, no collectives
            scored, stats = collect_batch(
                # Every rank draws the step's global prompts and keeps its share of them.
                next_indices=lambda k: rank_slice(self.sampler.take(k * world), self.dist),
                config=cfg,
                pad_id=self.pad_id,
                times=times,
                score_round=lambda idx, offset: self._shape_round(
                    generate_and_score(
                        rows=self.train_rows,
                        indices=idx,
                        group_offset=offset,
                        task=self.task,
                        tokenizer=self.tokenizer,
                        engine=self.engine,
                        reward_fn=self.reward_fn,
                        config=cfg,
                        times=times,
                    )
                ),
                target=self.share,
            )
        # Every rank updates, or none does (each update pass is a collective).
        (ready,) = self.dist.sum(float(scored is not None))
        metrics = dict(stats)
        t_update = time.perf_counter()
        if ready < world:
            metrics["skipped_update"] = 1.0
        else:
            batch, batch_metrics = self._batch(scored)
            metrics.update(scored.shaping_metrics)
            metrics.update(batch_metrics)
            metrics.update(policy_update(self.update_ctx, batch))
            self.engine.sync_weights()
            if cfg.train.log_samples and self.dist.is_main:
                self._log_samples(batch)
        t_end = time.perf_counter()
        metrics.update(
            {
                "time/generation": times.generation,
                "time/scoring": times.scoring,
                "time/training": t_end - t_update,
                "time/step": t_end - t_start,
                "generated_tokens": float(times.generated_tokens),
                "tokens_per_s": times.generated_tokens / max(t_end - t_start, 1e-9),
            }
        )
        return reduce_metrics(self.dist, metrics)

    def _shape(self, s: Scored) -> tuple[StepBatch, dict[str, float]]:
        """One round shaped and made a step batch, without group filtering."""
        shaped = self._shape_round(s)
        batch, metrics = self._batch(shaped)
        return batch, {**shaped.shaping_metrics, **metrics}

    def _shape_round(self, s: Scored) -> Scored:
        """The shapers on one round (composition: `policyopt.rewards.shaping`):
        R = w_task · M' + Σ other weighted functions + Σ shaper terms."""
        cfg = self.config
        task = s.task_rewards
        metrics: dict[str, float] = {}
        ctx = ShapingContext(
            step=self.step,
            total_steps=cfg.train.steps,
            group_ids=s.group_ids,
            correct=s.correct,
            prompts=s.prompts,
            completions=s.completions,
            columns=s.columns,
            rollouts=s.rollouts,
            model=self.model,
            tokenizer=self.tokenizer,
            logit_chunk_size=cfg.model.logit_chunk_size,
            raw=s.per_function,
            max_new_tokens=cfg.rollout.max_new_tokens,
        )
        for spec, shaper in zip(cfg.reward.shapers, self.shapers, strict=True):
            label, factory = f"reward shaper {spec.name!r}", SHAPERS.get(spec.name)
            gather(label, factory, step_structure(s.rollouts))
            before = dict(ctx.structure)
            task, m = shaper(task, ctx)
            metrics.update(m)
            new = {k: v for k, v in ctx.structure.items() if before.get(k) is not v}
            check_produced(label, factory, new, len(task))
            check_declared_made(label, factory, ctx.structure)
        task = task.float()
        rewards = s.task_weight * task + s.other_rewards
        for term in ctx.terms.values():
            rewards = rewards + term.float()
        return replace(s, rewards=rewards, filter_rewards=task, shaping_metrics=metrics)

    def _batch(self, s: Scored) -> tuple[StepBatch, dict[str, float]]:
        """Advantages of a (shaped, filtered) batch, and its loss mask."""
        cfg = self.config
        rewards = s.rewards
        metrics: dict[str, float] = {}
        name = cfg.algorithm.advantage
        wanted = gather(
            f"advantage estimator {name!r}", ADVANTAGES.get(name), step_structure(s.rollouts)
        )

        def estimate(r: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            return compute_advantages(name, r, g, **wanted, **cfg.algorithm.advantage_options)

        # Estimators of rewards alone see the global batch (REINFORCE++'s batch std); those
        # that read declared structure (DATPO's blocks, SRPO's distances) are per group, so
        # per rank (a group never spans ranks).
        advantages = (
            estimate(rewards, s.group_ids)
            if wanted
            else global_advantages(self.dist, estimate, rewards, s.group_ids)
        )
        loss_mask = s.rollouts.response_mask
        if cfg.algorithm.filter_truncated:  # DAPO's overlong filtering
            loss_mask = loss_mask * (~s.rollouts.truncated).float()[:, None]
        batch = StepBatch(
            rollouts=s.rollouts,
            group_ids=s.group_ids,
            prompts=s.prompts,
            completions=s.completions,
            rewards=rewards,
            advantages=advantages,
            loss_mask=loss_mask,
        )
        metrics["advantage/abs_mean"] = float(advantages.abs().mean())
        metrics["reward/shaped_mean"] = float(rewards.mean())
        return batch, metrics

    def _log_samples(self, batch: StepBatch) -> None:
        k = min(self.config.train.log_samples, len(batch))
        self.logger.log_samples(
            self.step + 1,
            [
                {
                    "prompt": batch.prompts[i],
                    "completion": batch.completions[i],
                    "reward": float(batch.rewards[i]),
                }
                for i in range(k)
            ],
        )

    def evaluate(self, samples: int | None = None) -> dict[str, float]:
        """Evaluation on rank 0 (the others wait); under FSDP2 on whole layers."""
        with full_weights(self.policy):
            result = self._evaluate(samples) if self.dist.is_main else {}
        self.dist.barrier()
        return result

    def _evaluate(self, samples: int | None) -> dict[str, float]:
        cfg = self.config
        with torch.no_grad():
            return evaluate(
                task=self.task,
                rows=self.eval_rows,
                tokenizer=self.tokenizer,
                engine=self.engine,
                max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                samples=cfg.eval.samples if samples is None else samples,
                temperature=cfg.eval.temperature,
                chat=cfg.model.chat_template,
                correct_threshold=cfg.reward.correct_threshold,
                console=self.console,
                progress=cfg.train.progress,
            )

    def close(self) -> None:
        self.logger.close()
        self.reward_fn.close()
        if self.dist.active and torch.distributed.is_initialized():
            # Wrappers (DDP's reducer) must go before their process group, or exit hangs.
            self.policy = self.ref_policy = self.update_ctx = None
            gc.collect()
            torch.distributed.destroy_process_group()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def resolve_tis_cap(setting: float | str | None, exact_logprobs: bool) -> float | None:
    """algorithm.tis_cap with "auto" resolved: C = 2 when the engine's log-probs are not the
    trainer's own, else off."""
    if setting == "auto":
        return None if exact_logprobs else DEFAULT_TIS_CAP
    return None if setting is None else float(setting)


def _status(m: dict[str, float]) -> str:
    parts = [
        f"reward {m.get('reward/mean', float('nan')):.3f}",
        f"acc {m.get('accuracy', float('nan')):.2f}",
    ]
    if "eval/accuracy" in m:
        parts.append(f"eval {m['eval/accuracy']:.2f}")
    return "  ".join(parts)
