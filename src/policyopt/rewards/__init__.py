"""Reward functions (TRL's signature), the weighted reward pipeline, and reward shapers."""

from policyopt.rewards import ranked_text  # noqa: F401  (registers the ndcg rewards)
from policyopt.rewards.functions import (
    REWARD_FUNCTIONS,
    RewardFunction,
    RewardFunctionError,
    RewardOutput,
    RewardPipeline,
    RewardResult,
    build_reward_pipeline,
    load_reward_function,
    task_reward_function,
)
from policyopt.rewards.overlong import overlong_penalty

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunction",
    "RewardFunctionError",
    "RewardOutput",
    "RewardPipeline",
    "RewardResult",
    "build_reward_pipeline",
    "load_reward_function",
    "overlong_penalty",
    "task_reward_function",
]
