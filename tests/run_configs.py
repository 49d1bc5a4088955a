"""Few-second training configs on the untrained tiny model, shared by the test folders."""

from pathlib import Path

TESTS_DIR = Path(__file__).parent


def small_overrides(output_dir: Path, steps: int = 4) -> list[str]:
    """A training run of a few seconds on the untrained tiny model, with a reward
    (`rewards_for_tests:digit_fraction`) that varies within groups so that updates happen."""
    return [
        f"train.output_dir={output_dir}",
        f"train.steps={steps}",
        "train.num_threads=1",
        "train.loggers=[jsonl]",
        "train.progress=false",
        "train.plot=false",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=12",
        "reward.functions=[{name: 'rewards_for_tests:digit_fraction'}]",
        "reward.correct_threshold=0.5",
        "optim.lr=0.001",
        "eval.size=8",
        "task.options={train_size: 200, eval_size: 20}",
    ]


def scored_round(trainer, indices: list[int]):  # noqa: ANN201
    """One generation round of the trainer on training rows `indices`, scored."""
    from policyopt.trainer.rollout_phase import RolloutTimes, generate_and_score

    return generate_and_score(
        rows=trainer.train_rows,
        indices=indices,
        group_offset=0,
        task=trainer.task,
        tokenizer=trainer.tokenizer,
        engine=trainer.engine,
        reward_fn=trainer.reward_fn,
        config=trainer.config,
        times=RolloutTimes(),
    )
