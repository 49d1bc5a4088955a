"""TRL's `GRPOTrainer` under the same settings as `policyopt bench` (the `bench` extra)."""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any


def time_trl(settings: dict[str, Any], steps: int) -> dict[str, Any]:
    try:
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        raise ImportError("--against trl needs TRL: pip install 'policyopt[bench]'") from None
    import datasets

    from policyopt.models.loading import load_model
    from policyopt.rewards.functions import task_reward_function
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
    n = settings["prompts_per_step"] * settings["group_size"]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t = 0.0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self._t = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.times.append(time.perf_counter() - self._t)

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
            bf16=False,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=data,
            processing_class=tok,
            callbacks=[timer],
        )
        trainer.train()
        lengths = [
            h["completions/mean_length"]
            for h in trainer.state.log_history
            if "completions/mean_length" in h
        ]
    measured = timer.times[1:]
    tokens = [m * n for m in lengths[1 : len(timer.times)]]
    return {
        "step_time_s": statistics.median(measured),
        "tokens_per_s": sum(tokens) / sum(measured),
        "generated_tokens_per_leaf": sum(tokens) / (len(tokens) * n) if tokens else float("nan"),
    }
