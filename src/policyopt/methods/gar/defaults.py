"""Every GAR default in one place: the paper's (SPEC §3) and its authors' code's.

The authors' values are read from github.com/LQgdwind/GAR at commit 7c1dce8:
`gar/online_reward.py` (the signal, anchors, rewards), `gar/reward_post_process.py` (format
gate, format bonus and penalty, think-length penalty) and the slime patch's argument
definitions and README table (`slime_gar.patch`, `README.md`). The `gar` shaper's own
defaults keep the authors' reward post-processing off (SPEC §3 steps 1-6); the `gar_authors`
preset (`AUTHORS_OPTIONS`) turns it on with these values.
"""

from __future__ import annotations

from typing import Any

# --- SPEC §3 (paper) ---------------------------------------------------------------------
R_BASE = 1.0  # r_base; also the authors' --gar-base-reward
BETA = 0.5  # β; also the authors' --gar-beta
MAX_SPAN_TOKENS = 768  # the paper's cap on the span that enters v

# --- the authors' anchors (online_reward.py; the patch's arguments) ------------------------
AUX_WEIGHT = 0.5  # w of `aux_residual` / `aux_max` (--gar-aux-weight)
ANCHOR_AGGREGATION = "aux_residual"  # --gar-anchor-aggregation (choices below)
ANCHOR_AGGREGATIONS = ("aux_residual", "real_only", "aux_max")
MAX_ANCHORS = 4  # per anchor type after de-duplication (README's gar_max_anchors_per_type)
AUTHORS_MAX_SPAN_TOKENS = 16384  # README's gar_max_response_tokens (the patch's own default
# is 0, "the full response"); keep-the-last-tokens truncation, as MAX_SPAN_TOKENS

# --- the authors' reward post-processing (reward_post_process.py) --------------------------
# Strict format: think open/close, answer open/close (STRICT_FORMAT_TAGS).
FORMAT_TAGS = ("<|think|>", "<|/think|>", "<answer>", "</answer>")
FORMAT_GATE = True  # DEFAULT_STRICT_FORMAT_GATE: a malformed rollout scores as failing
FORMAT_BONUS = 0.05  # DEFAULT_FORMAT_REWARD_BONUS (not in the GAR reward: see AUTHORS_OPTIONS)
INVALID_FORMAT_PENALTY = -0.6  # DEFAULT_INVALID_FORMAT_PENALTY
THINK_PENALTY = -0.5  # DEFAULT_THINK_PENALTY_MAX_VALUE: the penalty at or below `hard`
THINK_RELATIVE = True  # DEFAULT_THINK_PENALTY_DYNAMIC: thresholds from the anchor's length
THINK_TARGET_RATIO = 0.5  # target = round(0.5 · anchor think tokens) ...
THINK_TARGET_RANGE = (96, 512)  # ... clamped to [96, 512]
THINK_HARD_RATIO = 0.5  # hard = round(0.5 · target), within [1, target]
THINK_FALLBACK = (64, 256)  # (hard, target) without an anchor length, or not relative

# The `gar` shaper's options for running GAR as the authors' slime patch does. Their online
# reward (apply_online_gar) replaces the post-processed reward and adds back only the invalid-
# format and think-length penalties: the 0.05 format bonus never reaches the reward GAR
# trains on, so it is 0 here (set format_bonus: 0.05 for the post-processing's own reward).
AUTHORS_OPTIONS: dict[str, Any] = {
    "r_base": R_BASE,
    "beta": BETA,
    "aux_weight": AUX_WEIGHT,
    "anchor_aggregation": ANCHOR_AGGREGATION,
    "max_anchors": MAX_ANCHORS,
    "max_span_tokens": AUTHORS_MAX_SPAN_TOKENS,
    "format_tags": list(FORMAT_TAGS),
    "format_gate": FORMAT_GATE,
    "format_bonus": 0.0,
    "invalid_format_penalty": INVALID_FORMAT_PENALTY,
    "think_span": True,
    "think_penalty": THINK_PENALTY,
    "think_relative": THINK_RELATIVE,
    "think_target_ratio": THINK_TARGET_RATIO,
    "think_target_range": list(THINK_TARGET_RANGE),
    "think_hard_ratio": THINK_HARD_RATIO,
    "think_fallback": list(THINK_FALLBACK),
}
