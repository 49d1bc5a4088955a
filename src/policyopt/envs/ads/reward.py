"""The `dmrl_lrp` reward function: an edit's predicted long-term lift over the control.

For the completions (proposed edits) of one call, all from one live `dmrl_skill`
environment and one day:

1. read each edit (`read_edit`): "ok", "malformed", or "truncated" (no line end: never
   applied, whatever its prefix would parse as);
2. apply each distinct well-formed edit; the frozen lower agent sets its configuration;
3. test all of them in ONE multi-arm experiment against the deployed configuration (one
   control arm, the same day's traffic, arms stratified by population:
   `AdPlatform.multi_arm_test`), day-1 signals only;
4. the frozen LRP predicts each arm's 7-day value per user, per population; with the
   experiment's population shares w,

       R0        = Σ_p w_p ŷ(control, p)                    the control's predicted value
       lift_i    = Σ_p w_p ŷ(i, p) / R0 − 1                 candidate i's predicted lift
       R_i       = R0 · (1 + lift_i)                        well-formed edit
       R_i       = R0 · (1 − invalid_penalty)               malformed or truncated edit

   so R_i is affine in lift_i with the same R0 for the whole group: DRPO's robust group
   term and GRPO's z-score rank the candidates by their lifts over one common control, and
   DRPO's control term (R_i − R0)/|R0| is lift_i itself. A malformed or truncated edit
   scores as "no change" minus a bounded penalty (the environment's `invalid_penalty`,
   default 0.01 = 1% of the control's value), never 0 on a scale of ~15;
5. edit costs C_i (`edit_cost.py`; 0 for an invalid edit).

Returned: rewards R_i, structure `control_rewards` (R0 for every row) and `edit_costs`.
The LRP's memory bank holds the offline history's matured experiments and, as days pass,
the environment's deployed experiments once matured (never one from the future: the
bank's `visible` rule). The environment deploys the candidate with the best predicted lift
if it exceeds its `deploy_margin` (`SkillEnv.deploy`): one day per sampling round. Scoring
itself changes nothing of the world: the reward leaves the day's scored proposals with the
environment (`SkillEnv.scored`) and the task closes the day when the step's round ends
(`SkillDocTask.end_of_round`), so an evaluation that scores completions does not move it.

When the editor is an episode (`episode.py`: the task's world was bound to the `dmrl_editor`
environment), a completion is an episode of up to K edits and its reward is that of its
final document, by the same rules (`episode.episode_rewards`).

Each closed day appends one record to `env.log`: counts by status, the mean predicted lift, and
(when the environment has evaluation users) the TRUE 7-day lift of the proposals and of as
many random well-formed edits of the same document (the scripted editor, seeded by the
day), on the same evaluation users. That is evaluation only; nothing of it enters a reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from policyopt.envs.ads.episode import episode_rewards
from policyopt.envs.ads.scorer import Scorer, lift_rewards, load_scorer
from policyopt.envs.ads.skilldoc.document import Edit, read_edit
from policyopt.envs.ads.skilldoc.env import ScoredDay, SkillEnv
from policyopt.envs.ads.skilldoc.scripted import scripted_edit
from policyopt.rewards.functions import REWARD_FUNCTIONS, RewardOutput

# The frozen LRP and the lift arithmetic live in `scorer` (the episode environment shares
# them); they are named here too, where the reward's users have found them.
__all__ = ["LRPReward", "Scorer", "day_record", "lift_rewards", "load_scorer"]


@REWARD_FUNCTIONS.register("dmrl_lrp")
class LRPReward:
    """The `dmrl_lrp` reward of one live `dmrl_skill` task's world (module docstring). The
    pipeline builds it with the task (`for_task`), so it reads the world it is handed, never
    one found by a key. Scoring changes nothing of the world: it leaves the day's scored
    proposals with the environment, and the task ends the day when the step's round ends
    (`SkillDocTask.end_of_round` -> `SkillEnv.close_day`)."""

    for_task = True
    produces = ("control_rewards", "edit_costs")

    def __init__(self, task: Any) -> None:
        env = getattr(task, "env", None)
        if not isinstance(env, SkillEnv):
            raise ValueError(
                "dmrl_lrp scores the edits of a live dmrl_skill task, not of task "
                f"{getattr(task, 'name', type(task).__name__)!r}"
            )
        self.env = env
        self.scorer: Scorer | None = None

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> RewardOutput:
        """Predicted long-term rewards, control rewards and edit costs (module docstring)."""
        env = self.env
        if not completions:
            return RewardOutput([], {"control_rewards": [], "edit_costs": []})
        path = None if env.lrp_path is None else str(Path(env.lrp_path))
        if self.scorer is None or self.scorer.path != path:  # (re)loaded when the path moves
            self.scorer = load_scorer(env)
        scorer = self.scorer
        if env.played is not None:  # the editor as an episode (episode.py)
            return episode_rewards(env, scorer, completions)
        read = [read_edit(c, env.document) for c in completions]
        edits: list[Edit | None] = [e for e, _ in read]
        valid = [i for i, e in enumerate(edits) if e is not None]
        arm: dict[str, int] = {}  # distinct edit text -> treatment arm (duplicates share one)
        for i in valid:
            arm.setdefault(edits[i].text(), len(arm))  # type: ignore[union-attr]
        by_text = {edits[i].text(): edits[i] for i in valid}  # type: ignore[union-attr]
        docs = [env.document.apply(by_text[t]) for t in arm]  # type: ignore[arg-type]
        # No well-formed edit: an A/A arm still gives the control's predicted value.
        experiments = env.multi_arm_test(docs or [env.document])
        pv = scorer.pop_values(env, experiments)  # [K, 2, 4]
        rows = [None if e is None else arm[e.text()] for e in edits]
        rewards, r0, lifts = lift_rewards(pv, experiments[0].weights(), rows, env.invalid_penalty)
        pop_lifts = pv[:, 1] / pv[:, 0] - 1.0  # [K, 4]
        costs = torch.zeros(len(completions))
        if valid:
            ve = [edits[i] for i in valid]
            olds = [env.document.section_text(e.section) for e in ve]  # type: ignore[union-attr]
            news = [env.document.apply(e).section_text(e.section) for e in ve]  # type: ignore[union-attr,arg-type]
            secs = [e.section for e in ve]  # type: ignore[union-attr]
            acts = [e.action for e in ve]  # type: ignore[union-attr]
            costs[valid] = scorer.cost(secs, acts, olds, news).float()
        record = day_record(env, read, [float(lifts[arm[edits[i].text()]]) for i in valid])  # type: ignore[union-attr]
        best = None
        if arm:
            text = max(arm, key=lambda t: lifts[arm[t]])
            k = arm[text]
            best = (by_text[text], float(lifts[k]), k, tuple(float(x) for x in pop_lifts[k]))
        env.scored = ScoredDay(best, record)
        return RewardOutput(
            rewards,
            {"control_rewards": torch.full((len(completions),), r0), "edit_costs": costs},
        )


def day_record(
    env: SkillEnv, read: list[tuple[Edit | None, str]], pred: list[float]
) -> dict[str, Any]:
    """The day's record for `env.log` (module docstring), before deployment."""
    statuses = [s for _, s in read]
    rec: dict[str, Any] = {
        "day": env.day,
        "proposals": len(read),
        **{s: statuses.count(s) for s in ("ok", "malformed", "truncated")},
        "predicted_lift": float(np.mean(pred)) if pred else float("nan"),
    }
    if env.eval_users is None:
        return rec
    base = env.true_value(env.document)

    def true_lift(edit: Edit | None) -> float:  # an invalid edit changes nothing
        return 0.0 if edit is None else env.true_value(env.document.apply(edit)) / base - 1.0

    rec["true_lift"] = float(np.mean([true_lift(e) for e, _ in read]))
    rng = np.random.default_rng([env.platform.seed, 7, env.day])
    randoms = [scripted_edit(env.document, rng) for _ in range(len(read))]
    rec["random_true_lift"] = float(np.mean([true_lift(e) for e in randoms]))
    return rec
