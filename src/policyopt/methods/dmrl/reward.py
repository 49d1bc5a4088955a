"""The `dmrl_lrp` reward function: an edit's predicted long-term reward, with DRPO's structure.

For each completion (one proposed edit) of prompts from a live `dmrl_skill` environment:
parse the edit (malformed: reward None, logged and scored 0 by the pipeline, control reward
and edit cost still given), apply it, let the frozen lower agent set the parameters, A/B
test them against the deployed configuration (day-1 signals), and let the frozen LRP predict
both arms' 7-day value per user:

    reward R_i            = LRP(treatment arm)
    control_rewards R0_i  = LRP(control arm)     (structure for `drpo`)
    edit_costs C_i        = C(e_i)               (structure for `drpo`; 0 if malformed)

The LRP's memory bank holds the offline history's matured experiments and, as days pass,
the environment's deployed experiments once matured (never one from the future: the
bank's `visible` rule). After scoring, the environment deploys the candidate with the best
predicted lift R_i / R0_i − 1 if it exceeds the environment's `deploy_margin`
(`SkillEnv.deploy`): one day per call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from policyopt.core.structure import produces
from policyopt.methods.dmrl.edit_cost import EditCost
from policyopt.methods.dmrl.lrp import LRP
from policyopt.methods.dmrl.lrp_features import MemoryBank, build_bank, build_samples
from policyopt.methods.dmrl.lrp_io import load_lrp
from policyopt.rewards.functions import REWARD_FUNCTIONS, RewardOutput
from policyopt.tasks.adsim.abtest import POPS, Experiment
from policyopt.tasks.skilldoc.document import Edit, parse_edit
from policyopt.tasks.skilldoc.env import LIVE_ENVIRONMENTS, SkillEnv


class Scorer:
    """The frozen LRP and edit cost bound to one environment."""

    def __init__(self, model: LRP, bank: MemoryBank, cost: EditCost) -> None:
        self.model, self.bank, self.cost = model, bank, cost

    def bank_now(self, env: SkillEnv) -> MemoryBank:
        """The offline bank plus the environment's deployed experiments (all labelled; the
        model's visibility mask admits only those matured before a target's start)."""
        online = build_bank(env.experiments, float(self.model.y_mean), float(self.model.y_std))
        if len(online) == 0:
            return self.bank
        return MemoryBank(
            torch.cat([self.bank.keys, online.keys]),
            torch.cat([self.bank.values, online.values]),
            torch.cat([self.bank.matured_day, online.matured_day]),
        )

    def arm_values(self, env: SkillEnv, experiments: list[Experiment]) -> np.ndarray:
        """Predicted 7-day value per user of (control, treatment) [E, 2]."""
        s = build_samples(experiments)
        y = self.model.predict(s.x_agn, s.x_spe, s.start_day, self.bank_now(env))
        return (y * s.weight).view(-1, 2, POPS).sum(-1).numpy()


_SCORERS: dict[str, Scorer] = {}


def scorer_for(env_key: str, env: SkillEnv) -> Scorer:
    if env_key not in _SCORERS:
        path = env.lrp_path
        if path is None:
            raise ValueError(
                "dmrl_lrp: the dmrl_skill task has no trained LRP (task.options.lrp_path); "
                "`policyopt quickstart dmrl` trains one first"
            )
        model, bank = load_lrp(path)
        _SCORERS[env_key] = Scorer(model, bank, EditCost(env.risk_weights, env.eta))
    return _SCORERS[env_key]


@REWARD_FUNCTIONS.register("dmrl_lrp")
@produces("control_rewards", "edit_costs")
def dmrl_lrp_reward(
    prompts: list[str], completions: list[str], *, env_key: list[str], **columns: Any
) -> RewardOutput:
    """Predicted long-term rewards, control rewards and edit costs (module docstring)."""
    if not completions:
        return RewardOutput([], {"control_rewards": [], "edit_costs": []})
    if len(set(env_key)) != 1 or env_key[0] not in LIVE_ENVIRONMENTS:
        raise ValueError(
            f"dmrl_lrp: rows must come from one live dmrl_skill task, got {set(env_key)}"
        )
    env = LIVE_ENVIRONMENTS[env_key[0]]
    scorer = scorer_for(env_key[0], env)
    edits: list[Edit | None] = [parse_edit(c, env.document) for c in completions]
    valid = [i for i, e in enumerate(edits) if e is not None]
    # one A/B test per distinct edited document (identical candidates share a test)
    tests: dict[str, int] = {}
    experiments = []
    for i in valid:
        text = edits[i].text()  # type: ignore[union-attr]
        if text not in tests:
            tests[text] = len(experiments)
            experiments.append(env.ab_test(env.document.apply(edits[i]), len(experiments)))  # type: ignore[arg-type]
    values = scorer.arm_values(env, experiments) if experiments else np.zeros((0, 2))
    baseline = float(values[:, 0].mean()) if len(values) else _control_only(env, scorer)
    rewards: list[float | None] = [None] * len(completions)
    control = [baseline] * len(completions)
    for i in valid:
        k = tests[edits[i].text()]  # type: ignore[union-attr]
        rewards[i], control[i] = float(values[k, 1]), float(values[k, 0])
    costs = torch.zeros(len(completions))
    if valid:
        olds = [env.document.section_text(edits[i].section) for i in valid]  # type: ignore[union-attr]
        news = [env.document.apply(edits[i]).section_text(edits[i].section) for i in valid]  # type: ignore[union-attr,arg-type]
        secs = [edits[i].section for i in valid]  # type: ignore[union-attr]
        acts = [edits[i].action for i in valid]  # type: ignore[union-attr]
        costs[valid] = scorer.cost(secs, acts, olds, news).float()
    _deploy_best(env, edits, rewards, control, tests)
    return RewardOutput(
        rewards,
        {"control_rewards": torch.tensor(control), "edit_costs": costs},
    )


def _control_only(env: SkillEnv, scorer: Scorer) -> float:
    """Predicted value of the deployed configuration (an A/A test) when no edit parsed."""
    e = env.ab_test(env.document, 999)
    return float(scorer.arm_values(env, [e])[0, 0])


def _deploy_best(
    env: SkillEnv,
    edits: list[Edit | None],
    rewards: list[float | None],
    control: list[float],
    tests: dict[str, int],
) -> None:
    lifts = [
        (r / c - 1.0, i)
        for i, (r, c) in enumerate(zip(rewards, control, strict=True))
        if r is not None
    ]
    if not lifts:
        env.deploy(None, 0.0, 0)
        return
    lift, i = max(lifts)
    edit = edits[i]
    assert edit is not None
    env.deploy(edit, lift, tests[edit.text()])
