"""DATPO (arXiv 2609.08650): difficulty-adaptive tree rollouts for pass@k (SPEC §4).

Parts, each registered by name:
- `datpo_tree` rollout strategy (`strategy.py`): N base rollouts, adaptive budget
  (`budget.py`), sentence-entropy forks (`forks.py`), branches from the prefix's KV cache;
- `datpo` advantage estimator (`advantages.py`): block advantages over the tree
  (`tree_blocks.py`), plus the diversity bonus on positive blocks;
- `datpo_diversity` reward shaper (`diversity.py`): λ(step) · sibling cosine distance.
The update is the existing `ppo_clip` loss with per-token advantages (SPEC §4.6: token ratios,
block advantages).
"""

from policyopt.methods.datpo import advantages, diversity, strategy  # noqa: F401  (registers)
from policyopt.methods.datpo.budget import adaptive_budget
from policyopt.methods.datpo.strategy import B_MAX, K_MAX, N_BASE
from policyopt.methods.presets import register_preset

register_preset(
    "datpo",
    {
        "algorithm": {
            "advantage": "datpo",
            "loss": "ppo_clip",
            "agg": "seq-mean-token-mean",
        },
        "rollout": {
            "strategy": "datpo_tree",
            "strategy_options": {
                "n_base": N_BASE,
                "k_max": K_MAX,
                "b_max": B_MAX,
                "fork_unit": "sentence",
            },
        },
        "reward": {
            "shapers": [
                {
                    "name": "datpo_diversity",
                    "options": {"coef_start": 0.2, "coef_end": 0.0, "embedder": "auto"},
                }
            ]
        },
    },
)

__all__ = ["adaptive_budget"]
