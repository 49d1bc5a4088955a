import sys
from pathlib import Path

import pytest

from policyopt.trainer.config import Config, load_config

HERE = Path(__file__).parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def small_overrides(output_dir: Path, steps: int = 4) -> list[str]:
    """A training run of a few seconds on the untrained tiny model."""
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


@pytest.fixture
def small_config():
    def make(output_dir: Path, *extra: str, steps: int = 4) -> Config:
        return load_config(overrides=[*small_overrides(output_dir, steps), *extra])

    return make
