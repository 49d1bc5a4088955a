"""The live skill-document environment DMRL's editor acts in.

State: the deployed document (the best so far), the configuration the frozen lower agent
derives from it (the A/B tests' control), the day, and the recent A/B outcomes the editor
sees in its prompt. One training step is one day: the G candidate edits of each prompt are
A/B-tested against the deployed configuration (day-1 signals only), the reward function
scores them, and `deploy` makes the candidate with the best predicted long-term lift the new
control if that lift exceeds `deploy_margin` (0.5%). The deployed experiment's true 7-day label is computed
(it matures `HORIZON` days later, when it may enter the LRP's memory bank).

In the live world the platform's live population lives each day under the configuration
deployed that day (`AdPlatform.advance`, at the end of `deploy`), so tomorrow's A/B tests
draw users that carry what was deployed before. The platform must be at day `first_day`
when the environment starts (`history.burn_in`); a resumed environment replays its days.

The environment is an object its task owns; the `dmrl_lrp` reward is built with that task and
reads this environment directly (no registry, no key in the rows). Scoring leaves the day's
scored proposals in `scored`; `close_day` (called when the step's round ends) deploys and
logs, so scoring alone never moves the world.

With the editor as an episode (`policyopt.envs.ads.episode`), `played` holds the day's
episodes as the `dmrl_editor` environment played them (where each model turn ends), for the
reward to read; `close_day` empties it. None: the editor makes one edit per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policyopt.envs.ads.adsim.abtest import AdPlatform, Experiment
from policyopt.envs.ads.adsim.params import AdParams
from policyopt.envs.ads.adsim.world import Users
from policyopt.envs.ads.skilldoc.document import Edit, EditSequence, SkillDocument, parse_document
from policyopt.envs.ads.skilldoc.rule_agent import LowerAgent, RuleAgent
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT

ONLINE_ID_BASE = 1_000_000  # experiment ids of online A/B tests (offline history below)


@dataclass
class Outcome:
    edit: str
    lift: float  # predicted long-term lift, relative (0.01 = +1%)
    # predicted lift per population (POPULATIONS order); empty when not known
    pop_lifts: tuple[float, ...] = ()

    def line(self) -> str:
        pops = " ".join(f"{x * 100:+.1f}" for x in self.pop_lifts)
        return f"{self.lift * 100:+.1f}% {self.edit}" + (f" | pop {pops}" if pops else "")


@dataclass
class ScoredDay:
    """What the reward made of today's proposals, for `SkillEnv.close_day`: the best arm
    (edit, predicted lift, arm index, per-population lifts; None when no edit was
    well-formed) and the day's record for the log."""

    best: tuple[Edit | EditSequence, float, int, tuple[float, ...]] | None
    record: dict[str, Any]


@dataclass(eq=False)
class SkillEnv:
    platform: AdPlatform
    document: SkillDocument = START_DOCUMENT
    agent: LowerAgent = field(default_factory=RuleAgent)
    day: int = 0  # the online day; experiments start on `first_day + day`
    first_day: int = 0  # the day after the offline history ends
    recent: list[Outcome] = field(default_factory=list)
    recent_k: int = 2
    experiments: list[Experiment] = field(default_factory=list)  # deployed, with labels
    deployed_days: list[int] = field(default_factory=list)
    # Each deployment as (day, candidate index, document before, document after): enough to
    # recompute `experiments` on resume (an A/B test is a function of its id and configs).
    deployments: list[tuple[int, int, str, str]] = field(default_factory=list)
    # What the reward function needs to score edits (set by the task from its options).
    lrp_path: str | None = None
    risk_weights: dict[str, dict[str, float]] = field(default_factory=dict)
    eta: float = 0.5
    # Deploy only a predicted lift above this: the best of G noisy predictions overstates
    # its lift (winner's curse); a margin keeps the control from drifting on noise.
    deploy_margin: float = 0.005
    # Lift a malformed or truncated edit scores: "no change" minus this (reward.py).
    invalid_penalty: float = 0.01
    # The platform's fixed evaluation users (true values; evaluation and logging only).
    eval_users: Users | None = None
    # One record per day of what the editor proposed (reward.py): counts by status and,
    # when eval users are set, the proposals' true 7-day lifts over the deployed document.
    log: list[dict[str, Any]] = field(default_factory=list)
    # Today's scored proposals (the reward's), until `close_day` ends the day with them.
    scored: ScoredDay | None = field(default=None, repr=False)
    # The day's editor episodes as played (`episode.PlayedTurn` lists), when the editor is
    # an episode (`episode.EditorEnvironment.bind`); None: one edit per step.
    played: list[list[Any]] | None = field(default=None, repr=False)
    _values: dict[tuple[float, ...], float] = field(default_factory=dict, repr=False)

    @property
    def control(self) -> AdParams:
        return self.agent(self.document)

    @property
    def start_day(self) -> int:
        return self.first_day + self.day

    def prompt(self) -> str:
        return render_prompt(self.document, self.recent)

    def true_value(self, doc: SkillDocument) -> float:
        """True 7-day value per user of `doc`'s configuration on the evaluation users."""
        if self.eval_users is None:
            raise ValueError("SkillEnv.true_value: the environment has no evaluation users")
        params = self.agent(doc)
        key = tuple(params.as_dict().values())
        if key not in self._values:
            self._values[key] = self.platform.value(params, self.eval_users)
        return self._values[key]

    def multi_arm_test(
        self, candidates: list[SkillDocument], control: SkillDocument | None = None
    ) -> list[Experiment]:
        """Today's candidates in one multi-arm test against the deployed configuration, or
        against `control`'s (one control arm, the same users' traffic;
        `AdPlatform.multi_arm_test`)."""
        return self.platform.multi_arm_test(
            ONLINE_ID_BASE + 1000 * self.day,
            self.start_day,
            self.control if control is None else self.agent(control),
            [self.agent(c) for c in candidates],
        )

    def ab_test(self, candidate: SkillDocument, index: int, truth: bool = False) -> Experiment:
        """A/B test of `candidate`'s configuration against the deployed one, today."""
        return self.platform.ab_test(
            ONLINE_ID_BASE + 1000 * self.day + index,
            self.start_day,
            self.control,
            self.agent(candidate),
            truth=truth,
        )

    def deploy(
        self,
        edit: Edit | EditSequence | None,
        lift: float,
        index: int,
        pop_lifts: tuple[float, ...] = (),
    ) -> bool:
        """End the day: deploy `edit` if its predicted lift exceeds `deploy_margin`; True if
        deployed."""
        deployed = edit is not None and lift > self.deploy_margin
        new = self.document
        if deployed:
            assert edit is not None
            new = self.document.apply(edit)
            self.deployments.append((self.day, index, self.document.render(), new.render()))
            # the accepted experiment, re-run with its true label for the memory bank
            self.experiments.append(self.ab_test(new, index, truth=True))
            self.deployed_days.append(self.day)
        if edit is not None:
            self.recent = [*self.recent, Outcome(edit.text(), lift, pop_lifts)][-self.recent_k :]
        self.end_day(new)
        return deployed

    def close_day(self) -> None:
        """End the day the reward scored (nothing if none was): deploy its best edit if the
        margin allows (`deploy`), and log the day's record with what was deployed and, in the
        live world, the day the population lived."""
        scored, self.scored = self.scored, None
        if self.played is not None:  # the round's episodes were scored (or never will be)
            self.played.clear()
        if scored is None:
            return
        record = scored.record
        if scored.best is None:
            record["deployed"] = self.deploy(None, 0.0, 0)
        else:
            edit, lift, arm, pop_lifts = scored.best
            record["deployed"] = self.deploy(edit, lift, arm, pop_lifts)
        live = self.platform.live
        if live is not None and live.records:  # the day the live population just lived
            day = live.records[-1]
            record["live"] = {k: day[k] for k in ("value", "churned", "sat", "annoy", "habit")}
        if self.eval_users is not None:
            record["deployed_true_value"] = self.true_value(self.document)
        self.log.append(record)

    def end_day(self, tomorrow: SkillDocument) -> None:
        """Today was lived under the deployed document; `tomorrow` is deployed next."""
        self.platform.advance(self.control)
        self.document = tomorrow
        self.day += 1

    def state_dict(self) -> dict[str, Any]:
        """Plain data (checkpoints load with `weights_only=True`): documents as text, the
        deployed experiments as the deployments that recompute them."""
        return {
            "document": self.document.render(),
            "day": self.day,
            "recent": [[o.edit, o.lift, list(o.pop_lifts)] for o in self.recent],
            "deployments": [list(d) for d in self.deployments],
            "log": self.log,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replay the saved days on this (fresh) environment: each deployed A/B test re-run
        on its day with that day's control, and in the live world every day lived."""
        if self.day != 0 or self.platform.day not in (None, self.first_day):
            raise ValueError("SkillEnv.load_state_dict: the environment must be fresh (day 0)")
        self.experiments, self.deployed_days, self.deployments = [], [], []
        deployments = {int(d[0]): d for d in state["deployments"]}
        first = state["deployments"][0][2] if state["deployments"] else state["document"]
        self.document = parse_document(first)
        while self.day < int(state["day"]):
            if self.day not in deployments:
                self.end_day(self.document)
                continue
            day, index, before, after = deployments[self.day]
            self.document, new = parse_document(before), parse_document(after)
            self.experiments.append(self.ab_test(new, int(index), truth=True))
            self.deployed_days.append(int(day))
            self.deployments.append((int(day), int(index), before, after))
            self.end_day(new)
        self.document = parse_document(state["document"])
        self.log = list(state.get("log", []))
        self.recent = [
            Outcome(str(r[0]), float(r[1]), tuple(float(x) for x in (r[2] if len(r) > 2 else ())))
            for r in state["recent"]
        ]


def render_prompt(doc: SkillDocument, recent: list[Outcome]) -> str:
    lines = [doc.render(), "recent:"]
    lines += [o.line() for o in recent] or ["none"]
    lines.append("edit:")
    return "\n".join(lines) + "\n"
