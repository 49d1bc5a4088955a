"""DMRL's editor as an episode: edit, read the A/B result, edit again (environment `dmrl_editor`).

With `rollout.strategy: multi_turn` and `strategy_options: {environment: dmrl_editor,
max_turns: K}` (recipe `dmrl_episode`), each of the day's G samples per state is an episode of
up to K model turns instead of one edit. The episode starts from the day's state, the
deployed document its prompt shows, and keeps its own copy of the document:

- each model turn is read as the one-edit step reads a completion (`read_edit`: its first
  line, "truncated" without a line end, "malformed" when it does not parse against the
  episode's current document); a well-formed edit is applied to the episode's copy, the
  other two change nothing;
- the reply (turns 1..K-1) is the edit's A/B result, as the one-edit step's reward would
  compute it with the episode's current document deployed: one multi-arm test of the day
  (`SkillEnv.multi_arm_test`, the day's experiment id, one treatment arm) against the
  document before the edit, the frozen LRP's predicted 7-day lift, written compactly for a
  small model, then the prompt's own cue for the next edit:

      lift +0.8%          the edit was applied; its predicted long-term lift
      malformed           not applied
      truncated           not applied: the turn ended without a line end
      edit:

  (on its own line: a turn without a final newline is followed by one). On turn 1 it is
  exactly the one-edit reward's lift of the same edit alone. Turn K gets no reply: the
  environment ends the episode there.

The episode's reward (`episode_rewards`, what `dmrl_lrp` scores when the editor is an
episode) is the one-edit reward with the episode's final document in place of one edit's:
the day's distinct final documents are tested in ONE multi-arm experiment against the
deployed configuration (the day's control, R0), and

    R_i = R0 · (1 + lift(final_i) − invalid_penalty · m_i)    at least one well-formed edit
    R_i = R0 · (1 − invalid_penalty · m_i)                     none

with m_i the episode's malformed or truncated turns, so that R_i is still affine in the lift
over one common control (DRPO's control term is lift − penalty · m, its group term and GRPO's
z-score rank the episodes by it); C_i, DRPO's edit cost, is the sum of the episode's
well-formed edits' costs, each on the document it edited. With K = 1 every number is the
one-edit step's. The day's best final document is deployed if its predicted lift clears the
margin (`SkillEnv.deploy` of the episode's `EditSequence`), and the day's record holds, for
evaluation only, the true 7-day lift of the episodes' final documents and of as many random
edit sequences from the same state, each as many random well-formed edits as its episode had
turns (K, unless the token budget cut it).

The episode's text is its turns and replies; where each model turn ends is not in the text
(the model's end-of-turn token is not decoded, and a turn may write anything, a reply's
words included). So the environment records each episode as it plays it, in the live
world's `played` (the day's episodes, emptied when the day closes), and the reward reads the
turns of a completion from that record (`episode_turns`) and reads each turn again with
`read_edit` from the same documents: the environment and the reward agree by construction.
The environment holds the task's live world: the dmrl pipeline binds it
(`EditorEnvironment.bind`), with K from `max_turns`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from policyopt.envs.ads.scorer import Scorer, lift_rewards, load_scorer
from policyopt.envs.ads.skilldoc.document import Edit, EditSequence, SkillDocument, read_edit
from policyopt.envs.ads.skilldoc.env import ScoredDay, SkillEnv
from policyopt.envs.ads.skilldoc.scripted import edit_token_budget, scripted_edit
from policyopt.rewards.functions import RewardOutput
from policyopt.rollout.environment import ENVIRONMENTS, Environment, Episode, Reply

EDITOR = "dmrl_editor"
CUE = "edit:\n"  # the prompt ends with it; a reply ends with it too


def reply_text(turn: str, status: str, lift: float | None) -> str:
    """The reply to a model turn `turn` of status `status` (`read_edit`) whose edit's
    predicted lift is `lift` (module docstring)."""
    result = f"lift {lift * 100:+.1f}%" if status == "ok" and lift is not None else status
    return ("" if turn.endswith("\n") else "\n") + result + "\n" + CUE


def episode_token_budget(tokenizer: Any, turns: int, margin: int = 8) -> int:
    """Tokens an episode of `turns` edits needs: each turn the longest demonstration with
    its EOS, each reply but the last turn's the longest reply, plus `margin` (with 1 turn,
    `edit_token_budget`)."""
    replies = [
        reply_text("x", "truncated", None),
        reply_text("x", "malformed", None),
        reply_text("x", "ok", -1.0),  # a lift of three digits before the point
    ]
    reply = max(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies)
    return turns * edit_token_budget(tokenizer, 0) + (turns - 1) * reply + margin


@dataclass(frozen=True)
class PlayedTurn:
    """One model turn as the environment read it, and the reply it gave ("" for none)."""

    text: str
    reply: str


class EditorEnvironment(Environment):
    """The `dmrl_editor` environment (module docstring): episodes of up to `turns` edits on
    the bound live world's day."""

    def __init__(self) -> None:
        self.world: SkillEnv | None = None
        self.turns = 0
        self.scorer: Scorer | None = None
        # (day, document before, document after) -> predicted lift: the day's episodes
        # often repeat an edit from the same document, and a test is a function of these
        self._lifts: dict[tuple[int, str, str], float] = {}

    def bind(self, world: SkillEnv, turns: int) -> None:
        """Play episodes of up to `turns` edits on `world` (a live `dmrl_skill` task's), and
        record them in its `played` for the reward."""
        if turns < 1:
            raise ValueError(f"{EDITOR}: an episode needs at least one turn, got {turns}")
        self.world, self.turns = world, int(turns)
        self.scorer, self._lifts = None, {}
        if world.played is None:
            world.played = []

    def start(self, prompt: str, row: Mapping[str, Any] | None = None) -> Episode:
        """An episode from the day's state: the deployed document, which `prompt` shows."""
        world = self.world
        if world is None or world.played is None:
            raise ValueError(
                f"environment {EDITOR!r} has no live world: the dmrl pipeline binds the "
                "dmrl_skill task's (`policyopt quickstart dmrl_episode`)"
            )
        if world.document.render() not in prompt:
            raise ValueError(
                f"environment {EDITOR!r}: the prompt does not show the live world's deployed "
                "document; episodes start from the day's state (live rows only)"
            )
        turns: list[PlayedTurn] = []
        world.played.append(turns)
        return EditorEpisode(self, world.document, turns)

    def lift(self, before: SkillDocument, after: SkillDocument) -> float:
        """The LRP's predicted lift of `after` over `before` deployed, today (one treatment
        arm of the day's multi-arm test, as the one-edit reward computes an edit's)."""
        world = self.world
        assert world is not None
        key = (world.day, before.render(), after.render())
        if key not in self._lifts:
            if self._lifts and next(iter(self._lifts))[0] != world.day:
                self._lifts = {}  # a new day: yesterday's tests are not today's
            path = None if world.lrp_path is None else str(world.lrp_path)
            if self.scorer is None or self.scorer.path != path:
                self.scorer = load_scorer(world)
            experiments = world.multi_arm_test([after], control=before)
            pv = self.scorer.pop_values(world, experiments)
            _, _, lifts = lift_rewards(pv, experiments[0].weights(), [0], 0.0)
            self._lifts[key] = float(lifts[0])
        return self._lifts[key]


@dataclass
class EditorEpisode(Episode):
    """One episode: its own copy of the document and its turns as played."""

    env: EditorEnvironment
    document: SkillDocument
    turns: list[PlayedTurn] = field(default_factory=list)

    def step(self, turn: str) -> Reply:
        edit, status = read_edit(turn, self.document)
        after = self.document if edit is None else self.document.apply(edit)
        if len(self.turns) + 1 >= self.env.turns:  # the last edit: no result to read
            self.turns.append(PlayedTurn(turn, ""))
            self.document = after
            return Reply(done=True)
        lift = None if edit is None else self.env.lift(self.document, after)
        reply = reply_text(turn, status, lift)
        self.turns.append(PlayedTurn(turn, reply))
        self.document = after
        return Reply(messages=({"role": "user", "content": reply},))


def _matched(text: str, turns: list[PlayedTurn]) -> int | None:
    """How much of `text` the played `turns` account for, turn by turn and reply by reply;
    None if they do not. A reply may be missing only at the end (the strategy leaves a
    reply out when no turn follows it)."""
    pos = 0
    for i, t in enumerate(turns):
        if not text.startswith(t.text, pos):
            return None
        pos += len(t.text)
        if t.reply and text.startswith(t.reply, pos):
            pos += len(t.reply)
        elif pos != len(text) or i != len(turns) - 1:
            return None
    return pos


def episode_turns(text: str, played: list[list[PlayedTurn]]) -> list[str]:
    """The model turns of the episode whose text (turns and replies) is `text`, as one of
    the `played` episodes split it; text after the last played turn is a turn the token
    budget cut before the environment read it."""
    best: tuple[int, list[PlayedTurn]] | None = None
    for turns in played:
        end = _matched(text, turns)
        if end is not None and (best is None or end > best[0]):
            best = (end, turns)
    if best is None:
        raise ValueError(
            f"dmrl_lrp: a completion that no {EDITOR!r} episode of today played: the reward "
            "scores the day's episodes as the environment recorded them"
        )
    end, turns = best
    return [t.text for t in turns] + ([text[end:]] if end < len(text) else [])


@dataclass
class EpisodeRead:
    """An episode read again from the day's deployed document: each turn's status, the
    well-formed edits with the document each edited, and the final document."""

    statuses: list[str]
    edits: list[tuple[Edit, SkillDocument]]
    final: SkillDocument

    @property
    def invalid(self) -> int:
        return sum(s != "ok" for s in self.statuses)


def read_episode(text: str, world: SkillEnv) -> EpisodeRead:
    """The episode `text` of today, read as the environment read it (`episode_turns`)."""
    assert world.played is not None
    doc, statuses, edits = world.document, [], []
    for turn in episode_turns(text, world.played):
        edit, status = read_edit(turn, doc)
        statuses.append(status)
        if edit is not None:
            edits.append((edit, doc))
            doc = doc.apply(edit)
    return EpisodeRead(statuses, edits, doc)


def episode_rewards(env: SkillEnv, scorer: Scorer, completions: list[str]) -> RewardOutput:
    """The `dmrl_lrp` rewards, control rewards and edit costs of the day's episodes (module
    docstring); the day's scored episodes are left with the environment, as the one-edit
    reward leaves its proposals (`SkillEnv.scored`)."""
    reads = [read_episode(c, env) for c in completions]
    arm: dict[str, int] = {}  # distinct final document -> treatment arm
    first: dict[str, EpisodeRead] = {}
    for r in reads:
        if r.edits:
            arm.setdefault(r.final.render(), len(arm))
            first.setdefault(r.final.render(), r)
    # No episode with a well-formed edit: an A/A arm still gives the control's value.
    experiments = env.multi_arm_test([first[t].final for t in arm] or [env.document])
    pv = scorer.pop_values(env, experiments)  # [arms, 2, 4]
    rows = [arm[r.final.render()] if r.edits else None for r in reads]
    _, r0, lifts = lift_rewards(pv, experiments[0].weights(), rows, env.invalid_penalty)
    p = env.invalid_penalty
    rewards: list[float | None] = [
        r0 * (1.0 - p * r.invalid) if k is None else r0 * (1.0 + float(lifts[k]) - p * r.invalid)
        for r, k in zip(reads, rows, strict=True)
    ]
    costs = torch.zeros(len(completions))
    made = [(i, e, before) for i, r in enumerate(reads) for e, before in r.edits]
    if made:
        per_edit = scorer.cost(
            [e.section for _, e, _ in made],
            [e.action for _, e, _ in made],
            [before.section_text(e.section) for _, e, before in made],
            [before.apply(e).section_text(e.section) for _, e, before in made],
        ).float()
        for (i, _, _), c in zip(made, per_edit, strict=True):
            costs[i] += c
    best = None
    if arm:
        text = max(arm, key=lambda t: lifts[arm[t]])
        k = arm[text]
        pop_lifts = pv[k, 1] / pv[k, 0] - 1.0
        sequence = EditSequence(tuple(e for e, _ in first[text].edits))
        best = (sequence, float(lifts[k]), k, tuple(float(x) for x in pop_lifts))
    tested = [float(lifts[k]) for k in rows if k is not None]
    env.scored = ScoredDay(best, episode_record(env, reads, tested))
    return RewardOutput(
        rewards,
        {"control_rewards": torch.full((len(completions),), r0), "edit_costs": costs},
    )


def episode_record(env: SkillEnv, reads: list[EpisodeRead], pred: list[float]) -> dict[str, Any]:
    """The day's record for `env.log` (`reward.day_record`'s keys, per episode, and the turns'
    statuses), before deployment: for evaluation, the true lift of the episodes' final
    documents and of random edit sequences as long as the episodes (module docstring)."""
    statuses = [s for r in reads for s in r.statuses]
    rec: dict[str, Any] = {
        "day": env.day,
        "proposals": len(reads),
        "turns": len(statuses),
        **{s: statuses.count(s) for s in ("ok", "malformed", "truncated")},
        "predicted_lift": float(np.mean(pred)) if pred else float("nan"),
    }
    if env.eval_users is None:
        return rec
    base = env.true_value(env.document)
    rec["true_lift"] = float(
        np.mean([env.true_value(r.final) / base - 1.0 if r.edits else 0.0 for r in reads])
    )
    rng = np.random.default_rng([env.platform.seed, 7, env.day])  # the one-edit record's
    randoms = []
    for r in reads:
        doc = env.document
        for _ in r.statuses:
            doc = doc.apply(scripted_edit(doc, rng))
        randoms.append(env.true_value(doc) / base - 1.0)
    rec["random_true_lift"] = float(np.mean(randoms))
    return rec


ENVIRONMENTS.register(EDITOR)(EditorEnvironment)
