"""SRPO: structure-aware relative policy optimization for ranking (arXiv 2607.25268).

The policy is a Plackett–Luce distribution over a query's candidate items; a rollout is a
sampled ranking (its "tokens" are the items placed at each position). SRPO's parts: the
`srpo` advantage (reward differences over ranking distances), ranking distances between a
group's rollouts, and the usual per-position clipped loss. The pure functions live in
`policyopt.core` (the ranking policy and the engine use them too) and are re-exported here.
"""

from policyopt.core.ndcg import ndcg, ndcg_at_k
from policyopt.core.plackett_luce import (
    plackett_luce_entropy,
    plackett_luce_logprobs,
    sample_rankings,
)
from policyopt.core.rank_distance import complete_rankings, kendall_distances
from policyopt.methods.presets import register_preset
from policyopt.methods.srpo.advantage import srpo_advantages
from policyopt.methods.srpo.distances import RankingDistances

# SRPO (SPEC §6): structure-normalised advantages from the distances between a group's
# rankings, the per-position clipped ratio (ε = 0.2, as GRPO) with a per-sequence mean over
# positions. The paper's KL is per position too (set algorithm.kl_coef to use it).
register_preset(
    "srpo",
    {
        "algorithm": {
            "advantage": "srpo",
            "loss": "ppo_clip",
            "agg": "seq-mean-token-mean",
        },
        "reward": {"shapers": [{"name": "ranking_distances"}]},
    },
)

# PG-Rank (Singh & Joachims 2019, "Policy Learning for Fairness in Ranking", its policy
# gradient for PL rankers): REINFORCE on sampled rankings, log π(ranking) = Σ_t log π(L_t |
# L_<t), with the mean reward of the query's other samples as baseline (`rloo`); the
# gradient is unbiased for ∇ E[R] (tested against the exact expectation over all
# permutations). On-policy (one update per batch) the clipped ratio is 1: plain REINFORCE.
register_preset(
    "pg_rank",
    {
        "algorithm": {
            "advantage": "rloo",
            "loss": "ppo_clip",
            "agg": "seq-mean-token-sum",
            "clip_low": 0.2,
            "clip_high": 0.2,
        },
        "reward": {"shapers": []},
    },
)

__all__ = [
    "RankingDistances",
    "complete_rankings",
    "kendall_distances",
    "ndcg",
    "ndcg_at_k",
    "plackett_luce_entropy",
    "plackett_luce_logprobs",
    "sample_rankings",
    "srpo_advantages",
]
