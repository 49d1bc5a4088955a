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


def dmrl_tiny_overrides(days: int = 2) -> list[str]:
    """The `dmrl` recipe at the size of a few-second run: a small history and LRP, 2 SFT
    steps, one state x 4 edits a day for `days` days."""
    return [
        "task.options.history=24",
        "task.options.users_per_arm=50",
        "task.options.eval_users=100",
        "task.options.lrp={hidden: 8, warmup_epochs: 5, disc_epochs: 2, joint_epochs: 2}",
        "sft.steps=2",
        "rollout.group_size=4",
        "rollout.prompts_per_step=1",
        f"train.steps={days}",
        "train.progress=false",
        "train.plot=false",
    ]


def sampled_round(trainer, indices: list[int]):  # noqa: ANN201
    """One sampling round of the trainer on training rows `indices`, through the step's own
    stages: rollout, then score (policyopt.train.step)."""
    from policyopt.train.step import Times, rollout, score

    times = Times()
    batch = rollout(trainer.parts, trainer.state, indices, 0, times)
    return score(trainer.parts, batch, times)


def shaped_round(trainer, indices: list[int]):  # noqa: ANN201
    """`sampled_round`, then the shape stage."""
    from policyopt.train.step import shape

    return shape(trainer.parts, trainer.state, sampled_round(trainer, indices))


def finished_batch(trainer, indices: list[int]):  # noqa: ANN201
    """`shaped_round`, then the advantage stage (no group filter): what the update takes."""
    from policyopt.train.step import advantage

    return advantage(trainer.parts, trainer.dist, shaped_round(trainer, indices))
