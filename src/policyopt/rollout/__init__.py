"""Rollout engines: batched sampling (`hf`), vLLM (`vllm`), and the interface they implement."""

from policyopt.rollout import (  # noqa: F401  (registers the engines and strategies)
    hf_engine,
    multiturn,
    pl_engine,
    strategies,
    vllm_engine,
)
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
