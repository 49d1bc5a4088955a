"""Presets of the baselines, with their papers' defaults (SPEC section 1).

A loss's own defaults (clip range, aggregation) live in its function in
`policyopt.core.losses`; a preset states only what differs from them or what its paper
fixes. Its loss options belong to its loss: `algorithm.loss=gspo` on the grpo or dapo preset
starts from GSPO's own 3e-4 / 4e-4 (`policyopt.config.load.drop_replaced_options`; the
clip range a preset leaves unset is its loss's own, filled by
`policyopt.config.check.loss_settings`).
"""

from policyopt.methods.presets import register_preset

# DeepSeekMath GRPO: group-normalised advantages, token clip eps = 0.2 (ppo_clip's own),
# per-sequence mean then mean over sequences. The paper's KL (beta = 0.04) is off by default, as in TRL and
# verl's current recipes: set algorithm.kl_coef=0.04 to use it.
register_preset(
    "grpo",
    {
        "algorithm": {
            "advantage": "grpo",
            "loss": "ppo_clip",
            "agg": "seq-mean-token-mean",
        }
    },
)

# DAPO (arXiv 2503.14476): clip-higher 0.2/0.28, token-mean over the global batch, dynamic
# sampling (on the task reward: accuracy), overlong shaping (the `overlong` shaper: L_max =
# rollout.max_new_tokens, L_cache = 0.2 L_max as in the paper); no KL. Overlong filtering,
# the paper's alternative, is algorithm.filter_truncated (off).
register_preset(
    "dapo",
    {
        "algorithm": {
            "advantage": "grpo",
            "loss": "ppo_clip",
            "agg": "token-mean",
            "clip_high": 0.28,  # clip-higher; ε_low = 0.2 is the token clip's own
            "kl_coef": 0.0,
            "dynamic_sampling": True,
        },
        "reward": {"shapers": [{"name": "overlong", "options": {}}]},
    },
)

# Dr. GRPO (arXiv 2503.20783): no std division, token sums over a constant (max length).
register_preset(
    "dr_grpo",
    {
        "algorithm": {
            "advantage": "dr_grpo",
            "loss": "ppo_clip",
            "agg": "seq-mean-token-sum-norm",
        }
    },
)

# GSPO (arXiv 2507.18071): sequence ratio, clip 3e-4/4e-4 (the gspo loss's own defaults).
# Its sequence clip only acts off-policy, so as in the paper each rollout batch is split
# into 4 minibatches.
register_preset("gspo", {"algorithm": {"advantage": "grpo", "loss": "gspo", "minibatches": 4}})

# RLOO: leave-one-out baseline, REINFORCE on the sequence log-prob (token sum).
register_preset(
    "rloo",
    {
        "algorithm": {
            "advantage": "rloo",
            "loss": "ppo_clip",
            "agg": "seq-mean-token-sum",
        }
    },
)

# REINFORCE++ (batch-normalised returns) with the token clip.
register_preset(
    "reinforce_pp",
    {
        "algorithm": {
            "advantage": "reinforce_pp",
            "loss": "ppo_clip",
            "agg": "token-mean",
        }
    },
)
