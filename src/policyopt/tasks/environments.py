"""The single-method environments, declared by name and imported on first use.

Each lives in `policyopt.envs.<name>` and its third-party packages come with a pip extra, so
that `pip install policyopt` pulls only what the library imports. A config may name their
tasks, reward functions and grammars at any time: the lookup imports the environment, or says
which extra to install (`policyopt.core.registry.Registry.lazy`).
"""

from __future__ import annotations

from policyopt.rewards.functions import REWARD_FUNCTIONS
from policyopt.rollout.environment import ENVIRONMENTS
from policyopt.rollout.grammar import GRAMMARS
from policyopt.tasks.base import TASKS

# DocPO's document parsing (lxml, apted, rapidfuzz, sympy, latex2sympy2).
DOCPARSE = "policyopt.envs.docparse"
DOCPARSE_ELEMENTS = ("text", "table", "formula")
# DMRL's advertising platform, skill document and long-term reward predictor.
ADS = "policyopt.envs.ads"
# Learning to rank: synthetic, click and diversity collections, the LM reranker; LightGBM's
# LambdaRank baseline.
LTR = "policyopt.envs.ltr"
# Tasksets written for the `verifiers` package, their tools in multi-turn rollouts.
VERIFIERS = "policyopt.envs.verifiers_env"

TASKS.lazy("docparse", DOCPARSE, "docpo")
REWARD_FUNCTIONS.lazy("docparse", DOCPARSE, "docpo")
for _kind in DOCPARSE_ELEMENTS:
    REWARD_FUNCTIONS.lazy(f"docparse_{_kind}", DOCPARSE, "docpo")

TASKS.lazy("dmrl_skill", ADS, "dmrl")
REWARD_FUNCTIONS.lazy("dmrl_lrp", ADS, "dmrl")
GRAMMARS.lazy("skill_rule", ADS, "dmrl")
GRAMMARS.lazy("skill_edit", ADS, "dmrl")
ENVIRONMENTS.lazy("dmrl_editor", ADS, "dmrl")

for _name in ("ltr_synthetic", "ltr_clicks", "ltr_diversity", "rerank"):
    TASKS.lazy(_name, LTR, "rank")

TASKS.lazy("verifiers", VERIFIERS, "verifiers")
ENVIRONMENTS.lazy("verifiers", VERIFIERS, "verifiers")
