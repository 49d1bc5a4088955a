"""Rollout engines: batched sampling (`hf`), and the interface others plug into."""

from policyopt.rollout import hf_engine, pl_engine, strategies  # noqa: F401  (registers "hf", "pl", "parallel")
from policyopt.rollout.base import ENGINES, RolloutEngine, Rollouts, SamplingParams, concat_rollouts
from policyopt.rollout.strategies import ROLLOUT_ANNOTATORS, ROLLOUT_STRATEGIES

__all__ = [
    "ROLLOUT_ANNOTATORS",
    "ROLLOUT_STRATEGIES",
    "ENGINES",
    "RolloutEngine",
    "Rollouts",
    "SamplingParams",
    "concat_rollouts",
]
