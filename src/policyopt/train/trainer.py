"""The trainer: set-up, the loop over steps, resume, logging and evaluation.

The step itself is `policyopt.train.step.train_step` over the parts `build_parts` bound
from the config (rollout -> score -> shape -> filter -> advantage -> update); methods are
registered parts and presets, not subclasses.
"""

from __future__ import annotations

import copy
import gc
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from policyopt.config.load import Config, dump_config
from policyopt.config.resume_check import check_resume_config, check_resume_data, data_fingerprint
from policyopt.core.tis import DEFAULT_TIS_CAP
from policyopt.models.lora import apply_lora, disabled_adapter
from policyopt.models.precision import set_precision
from policyopt.models.threads import apply_num_threads
from policyopt.store import checkpoint as ckpt
from policyopt.store import run_folder
from policyopt.store.metrics_log import MetricsLogger, progress_bar, read_metrics
from policyopt.store.plot import plot_metrics
from policyopt.train import dist_checkpoint
from policyopt.train.batch import Batch
from policyopt.train.distributed import (
    full_weights,
    rank_device,
    reduce_metrics,
    setup,
    share,
    wrap_policy,
)
from policyopt.train.held_out import eval_rows, evaluate_run
from policyopt.train.interrupt import RunInterrupted, interrupt_requests
from policyopt.train.optim import build_optimizer
from policyopt.train.parts import build_parts
from policyopt.train.policy import load_policy
from policyopt.train.prompts import PromptSampler, check_chat_template, check_positions
from policyopt.train.stall import StallWatch
from policyopt.train.step import StepState, train_step
from policyopt.train.update import NonFiniteUpdateError, Optimization


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
        self.console = console or Console()
        # Data parallelism under torchrun (trainer.distributed); one process: rank 0 of 1.
        self.dist = setup(cfg.train.parallel, cfg.model.device)
        seed_everything(cfg.train.seed)
        self.output_dir = Path(cfg.train.output_dir)
        # The folder is this run's before anything is written: refused if it holds the
        # user's files or another live run (store/run_folder.py); rank 0 holds it.
        if self.dist.is_main:
            run_folder.claim(self.output_dir)
        try:
            self._set_up(model, tokenizer)
        except BaseException:
            # A run that never started leaves no run behind (no config.yaml that looks like
            # one); a folder it created and wrote nothing else into goes too.
            if self.dist.is_main:
                run_folder.release(self.output_dir, abandon=True)
            raise

    def _set_up(self, model: torch.nn.Module | None, tokenizer: Any) -> None:
        cfg = self.config
        self.output_dir.mkdir(parents=True, exist_ok=True)
        # The data the run trains on, by content: saved with each checkpoint and compared on
        # resume (config/resume_check.py), as the config is.
        self.data_fingerprint = data_fingerprint(cfg) if self.dist.is_main else {}
        # Which checkpoint to continue, checked against its config and data before anything
        # is written; rank 0 repairs and decides, the other ranks follow.
        self.resume_from = self.dist.broadcast(self._resume_point() if self.dist.is_main else None)
        # Every part checked and bound to its options, the task built (before any model).
        self.parts = parts = build_parts(cfg)
        self.task, self.reward_fn = parts.task, parts.reward
        self.shapers = [shaper for _, shaper in parts.shapers]
        self.train_rows = self.task.rows("train")
        self.eval_rows = eval_rows(self.task, cfg.eval.size)
        if model is None:
            device = rank_device(cfg.model.device, self.dist)
            model, tokenizer = load_policy(
                cfg.model.model_copy(update={"device": device}), self.task
            )
        # Limits before work: a chat template the tokenizer lacks (the embedded model's
        # character tokenizer has none) is one line here, not transformers' error at step 1.
        check_chat_template(cfg, tokenizer)
        # A prompt that leaves no room for its response fails here, naming the row, not
        # deep in the first rollout (or, with rotary positions, trains past them silently).
        check_positions(model, tokenizer, self.task, "train", self.train_rows, cfg)
        check_positions(model, tokenizer, self.task, "eval", self.eval_rows, cfg)
        if cfg.model.lora.enabled:
            lora = cfg.model.lora
            model = apply_lora(
                model,
                rank=lora.rank,
                alpha=lora.alpha,
                target_modules=lora.target_modules,
                dropout=lora.dropout,
            )
        set_precision(model, cfg.model.precision)  # after LoRA: its adapters are trainable
        self.num_threads = apply_num_threads(cfg.train.num_threads, model)  # "auto": by size
        pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        engine = parts.make_engine(model, tokenizer)
        # The reference policy is copied before wrapping (FSDP2 shards the policy in place).
        ref_model = None
        if cfg.algorithm.kl_coef > 0 and not cfg.model.lora.enabled:
            ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        logp_options = {
            "temperature": cfg.rollout.temperature,
            "chunk_size": cfg.model.logit_chunk_size,
        }
        policy = wrap_policy(model, self.dist, **logp_options)
        ref_policy = (
            wrap_policy(ref_model, self.dist, trainable=False, **logp_options)
            if ref_model is not None
            else None
        )
        params = [p for p in model.parameters() if p.requires_grad]
        updates_per_step = cfg.algorithm.ppo_epochs * cfg.algorithm.minibatches
        optimizer, scheduler = build_optimizer(
            params, cfg.optim, cfg.train.steps * updates_per_step
        )
        # The one holder of the model, its optimizer, the engine and the tokenizer: the step
        # acts on it; the trainer's names below read it.
        self.state = StepState(
            step=0,
            rows=self.train_rows,
            sampler=PromptSampler(len(self.train_rows), cfg.train.seed),
            engine=engine,
            tokenizer=tokenizer,
            pad_id=pad_id,
            share=share(cfg.rollout.prompts_per_step, self.dist),
            optimization=self._optimization(
                model, policy, ref_policy, engine, optimizer, scheduler
            ),
            dist=self.dist,
        )
        self.generated_tokens = 0  # over the whole run, for train.max_generated_tokens
        self.stall = StallWatch()  # says once when every advantage stays 0
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
        if self.dist.is_main:  # once set-up succeeded: a run that failed to start leaves none
            _write_atomically(self.output_dir / "config.yaml", dump_config(cfg))

    # Short names for what the state holds (checkpointing, evaluation and tests read them).
    @property
    def step(self) -> int:
        return self.state.step

    @step.setter
    def step(self, value: int) -> None:
        self.state.step = value

    @property
    def sampler(self) -> PromptSampler:
        return self.state.sampler

    @property
    def model(self) -> torch.nn.Module:
        return self.state.optimization.model

    @property
    def policy(self) -> torch.nn.Module:
        return self.state.optimization.policy

    @property
    def optimization(self) -> Optimization:
        return self.state.optimization

    @property
    def engine(self) -> Any:
        return self.state.engine

    @property
    def tokenizer(self) -> Any:
        return self.state.tokenizer

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.optimization.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.optimization.scheduler

    @property
    def pad_id(self) -> int:
        return self.state.pad_id

    # ----------------------------------------------------------------- setup helpers
    def _optimization(
        self,
        model: torch.nn.Module,
        policy: torch.nn.Module,
        ref_policy: torch.nn.Module | None,
        engine: Any,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
    ) -> Optimization:
        cfg = self.config
        reference, reference_context = ref_policy, None
        if cfg.algorithm.kl_coef > 0 and cfg.model.lora.enabled:
            # The reference policy is the base model: the policy with its adapter off.
            reference = policy
            reference_context = lambda: disabled_adapter(model)  # noqa: E731
        return Optimization(
            model=model,
            policy=policy,
            optimizer=optimizer,
            scheduler=scheduler,
            dist=self.dist,
            reference=reference,
            reference_context=reference_context,
            ppo_epochs=cfg.algorithm.ppo_epochs,
            minibatches=cfg.algorithm.minibatches,
            micro_batch_size=cfg.train.micro_batch_size,
            max_grad_norm=cfg.optim.max_grad_norm,
            tis_cap=resolve_tis_cap(cfg.algorithm.tis_cap, engine.exact_logprobs),
            behaviour_old_logp=cfg.rollout.staleness > 0,
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
            changed += check_resume_data(path, self.data_fingerprint, self.config)
            if changed:
                self.console.print(f"resuming anyway with changed {', '.join(changed)}")
        return path

    def _maybe_resume(self) -> None:
        path = self.resume_from
        if path is None:
            if self.dist.is_main:
                self._start_over()
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
        self.optimization.nonfinite_in_a_row = nonfinite.get("in_a_row", 0)
        self.optimization.nonfinite_total = nonfinite.get("total", 0)
        if self.dist.is_main:
            dropped = self._forget_logs_after(self.step)
            later = f"; dropped {dropped} logged step(s) after it" if dropped else ""
            self.console.print(
                f"resuming from step {self.step} ({path}){later}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def _start_over(self) -> None:
        """Step 0 in a folder whose logs may hold an earlier attempt (killed before its first
        checkpoint, or train.resume=null): what is dropped is said, not done silently."""
        dropped = self._forget_logs_after(0)
        if dropped:
            why = (
                "train.resume=null"
                if self.config.train.resume is None
                else f"no complete checkpoint in {self.output_dir}"
            )
            self.console.print(
                f"starting at step 1 ({why}): dropped the {dropped} logged step(s) of the "
                "earlier attempt from metrics.jsonl",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def _forget_logs_after(self, step: int) -> int:
        """Drop log records past `step`; returns how many metrics.jsonl steps went."""
        before = {r.get("step") for r in read_metrics(self.logger.jsonl)}
        torn = self.logger.truncate_after(step)
        if torn:
            self.console.print(
                f"dropped {torn} torn line(s) from the JSONL logs (killed mid-write)"
            )
        return sum(1 for s in before if isinstance(s, int) and s > step)

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
                "in_a_row": self.optimization.nonfinite_in_a_row,
                "total": self.optimization.nonfinite_total,
            },
            # Written beside the state (checkpoint.save_state), read by the next resume.
            ckpt.DATA_KEY: self.data_fingerprint,
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
        """Train to `config.train.steps` (or stop early at `until_step`, saving there).

        Ctrl-C (SIGINT) ends the step under way, saves it and raises `RunInterrupted`; a
        second Ctrl-C stops at once, losing the steps since the last checkpoint."""
        try:
            with interrupt_requests() as interrupted:
                return self._train(until_step, interrupted)
        except RunInterrupted:
            raise
        except KeyboardInterrupt:  # a second Ctrl-C, or one where no handler could be set
            latest = ckpt.latest_checkpoint(self.output_dir)
            resume = (
                f"the latest checkpoint is step {ckpt.step_of(latest)}, where the same "
                "command resumes"
                if latest is not None
                else "no checkpoint was saved, so the same command starts over"
            )
            raise RunInterrupted(
                f"interrupted in step {self.step + 1}, before it was complete; {resume}"
            ) from None

    def _train(self, until_step: int | None, interrupted: Callable[[], bool]) -> dict[str, float]:
        cfg = self.config.train
        last = min(cfg.steps, until_step) if until_step is not None else cfg.steps
        final: dict[str, float] = {}
        with progress_bar(self.console, cfg.progress and self.dist.is_main) as bar:
            task_id = bar.add_task("train", total=cfg.steps, completed=self.step, status="")
            while self.step < last and not self.budget_spent():
                metrics = self.run_step()
                stalled = self.stall.update(metrics)
                if stalled and self.dist.is_main:
                    self.console.print(f"warning at step {self.step}: {stalled}", soft_wrap=True)
                if self.config.eval.every and self.step % self.config.eval.every == 0:
                    metrics.update(self.evaluate())
                halt = self._nonfinite_halt()
                if self.dist.is_main and (
                    self.step % cfg.log_every == 0 or self.step == last or halt
                ):
                    self.logger.log(self.step, metrics)
                if halt:
                    raise NonFiniteUpdateError(halt)
                saved = bool(cfg.save_every) and self.step % cfg.save_every == 0
                if saved:
                    self.save()
                bar.update(task_id, completed=self.step, status=_status(metrics))
                final = metrics
                # Every rank stops at the same step boundary if any rank was interrupted.
                if self.dist.max_int(int(interrupted())):
                    path = None if saved else self.save()
                    where = path or ckpt.latest_checkpoint(self.output_dir)
                    raise RunInterrupted(
                        f"interrupted at step {self.step}, saved as {where}; the same command "
                        "resumes from it"
                    )
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
        count = self.optimization.nonfinite_in_a_row
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

    def run_step(self) -> dict[str, float]:
        """One step of the run (`policyopt.train.step.train_step`), its samples logged, and
        the run's counters moved on (steps done, generated tokens); the metrics over all
        ranks. `train` calls it in its loop; a benchmark may call it alone."""
        # Reward functions see TRL's trainer_state: the optimizer steps done so far.
        self.reward_fn.trainer_state.global_step = self.step
        self.reward_fn.trainer_state.max_steps = self.config.train.steps
        batch, metrics = train_step(self.parts, self.state)
        if batch is not None and self.config.train.log_samples and self.dist.is_main:
            self._log_samples(batch)
        metrics = reduce_metrics(self.dist, metrics)
        self.step += 1  # per-step caches, schedules and shapers' annealing move on
        self.generated_tokens += int(metrics["generated_tokens"])
        metrics["generated_tokens_total"] = float(self.generated_tokens)
        return metrics

    def _log_samples(self, batch: Batch) -> None:
        k = min(self.config.train.log_samples, len(batch))
        # What the completion should have said (the task's answer column, when the rows
        # have one) and whether the task's check passed, for reading samples by eye.
        references = batch.columns.get(self.task.answer_column)
        samples = []
        for i in range(k):
            sample: dict[str, Any] = {
                "prompt": batch.prompts[i],
                "completion": batch.completions[i],
                "reward": float(batch.rewards["total"][i]),
            }
            if references is not None:
                sample["reference"] = references[i]
            if batch.correct is not None:
                sample["correct"] = bool(batch.correct[i])
            samples.append(sample)
        self.logger.log_samples(self.step + 1, samples)

    def evaluate(self, samples: int | None = None) -> dict[str, float]:
        """Evaluation on rank 0 (the others wait); under FSDP2 on whole layers."""
        with full_weights(self.policy):
            result = self._evaluate(samples) if self.dist.is_main else {}
        self.dist.barrier()
        return result

    def _evaluate(self, samples: int | None) -> dict[str, float]:
        with torch.no_grad():
            return evaluate_run(
                self.parts.evaluation,
                self.task,
                self.tokenizer,
                self.engine,
                rows=self.eval_rows,
                samples=samples,
                console=self.console,
            )

    def close(self) -> None:
        self.logger.close()
        self.reward_fn.close()
        if self.dist.is_main:
            run_folder.release(self.output_dir)
        if self.dist.active and torch.distributed.is_initialized():
            # Wrappers (DDP's reducer) must go before their process group, or exit hangs.
            self.state = None  # the policy, its optimizer and the engine with it
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
