"""TRL's `GRPOTrainer` under the same settings as `policyopt bench` (the `bench` extra)."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


def time_trl(
    settings: dict[str, Any], steps: int, between: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Median step time (and CPU time) of `steps` TRL steps after one warm-up step.

    `between(i)`, if given, runs after TRL's step i, outside its timing and with TRL's RNG
    state put back afterwards (`policyopt bench` times its own arms there)."""
    try:
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        raise ImportError("--against trl needs TRL: pip install 'policyopt[bench]'") from None
    import datasets

    from policyopt.models.loading import load_model
    from policyopt.rewards.functions import task_reward_function
    from policyopt.store.checkpoint import rng_state, set_rng_state
    from policyopt.tasks.base import get_task

    task = get_task("arithmetic")
    rows = task.rows("train").select(range(4096))
    data = datasets.Dataset.from_dict(
        {
            "prompt": [task.format_prompt(r) for r in rows],
            "answer": list(rows["answer"]),
            "solution": list(rows["solution"]),
        }
    )
    verify = task_reward_function(task)

    def reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [0.0 if v is None else float(v) for v in verify(prompts, completions, **columns)]

    model, tok = load_model(settings["model"])
    peft_config = None
    if settings.get("lora"):
        from peft import LoraConfig

        lora = settings["lora"]
        peft_config = LoraConfig(
            r=lora["rank"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules=lora["target_modules"],
            task_type="CAUSAL_LM",
        )
    n = settings["prompts_per_step"] * settings["group_size"]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu_times: list[float] = []  # CPU time of the process, all threads
            self._t = self._cpu = 0.0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self._t, self._cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.times.append(time.perf_counter() - self._t)
            self.cpu_times.append(time.process_time() - self._cpu)
            if between is not None:
                state = rng_state()
                between(len(self.times) - 1)
                set_rng_state(state)

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=n,
            num_generations=settings["group_size"],
            max_completion_length=settings["max_new_tokens"],
            temperature=settings["temperature"],
            learning_rate=settings["lr"],
            beta=0.0,
            num_iterations=1,
            loss_type="grpo",
            max_steps=steps + 1,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=bool(settings.get("bf16", False)),
            # On by default in TRL's GRPOConfig; policyopt keeps the activations, so a
            # recompute here would be time charged to TRL's arm only.
            gradient_checkpointing=False,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=data,
            processing_class=tok,
            callbacks=[timer],
            peft_config=peft_config,
        )
        trainer.train()
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        checkpointing = bool(trainer.args.gradient_checkpointing)
        lengths = [
            h["completions/mean_length"]
            for h in trainer.state.log_history
            if "completions/mean_length" in h
        ]
    measured = timer.times[1:]
    tokens = [m * n for m in lengths[1 : len(timer.times)]]
    return {
        "lora": settings.get("lora"),
        "bf16": bool(settings.get("bf16", False)),
        "trainable_parameters": trainable,
        "gradient_checkpointing": checkpointing,
        "step_times_s": measured,
        "step_time_s": statistics.median(measured),
        "cpu_time_s": statistics.median(timer.cpu_times[1:]),
        "tokens_per_s": sum(tokens) / sum(measured),
        "generated_tokens_per_leaf": sum(tokens) / (len(tokens) * n) if tokens else float("nan"),
    }
