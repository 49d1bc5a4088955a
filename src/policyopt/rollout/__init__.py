"""Rollout engines: batched sampling (`hf`), and the interface others plug into."""

from policyopt.rollout import hf_engine  # noqa: F401  (registers "hf")
from policyopt.rollout.base import ENGINES, RolloutEngine, Rollouts, SamplingParams, concat_rollouts

__all__ = ["ENGINES", "RolloutEngine", "Rollouts", "SamplingParams", "concat_rollouts"]
