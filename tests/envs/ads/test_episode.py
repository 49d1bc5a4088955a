"""DMRL's editor as an episode: the `dmrl_editor` environment's episodes, replies and
records, and the `dmrl_lrp` reward of episodes against the one-edit step's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import make_history
from policyopt.envs.ads.episode import (
    CUE,
    EditorEnvironment,
    PlayedTurn,
    episode_token_budget,
    episode_turns,
    reply_text,
)
from policyopt.envs.ads.lrp.features import build_bank
from policyopt.envs.ads.lrp.io import load_lrp, save_lrp
from policyopt.envs.ads.lrp.train import LRPTrainConfig, train_lrp
from policyopt.envs.ads.reward import LRPReward, Scorer
from policyopt.envs.ads.skilldoc.document import parse_edit
from policyopt.envs.ads.skilldoc.env import ONLINE_ID_BASE
from policyopt.envs.ads.skilldoc.scripted import edit_token_budget
from policyopt.methods.dmrl.edit_cost import EditCost
from policyopt.models.tiny import build_char_tokenizer
from policyopt.rollout.environment import ENVIRONMENTS
from policyopt.tasks.base import get_task


@pytest.fixture(scope="module")
def lrp_dir(tmp_path_factory):
    history = make_history(AdPlatform(seed=0, users_per_arm=60), 16, per_day=2)
    model, _ = train_lrp(
        history, LRPTrainConfig(hidden=8, warmup_epochs=5, disc_epochs=2, joint_epochs=2)
    )
    path = tmp_path_factory.mktemp("lrp")
    save_lrp(path, model, build_bank(history, float(model.y_mean), float(model.y_std)))
    return path


def live_task(lrp_dir):
    return get_task(
        "dmrl_skill", users_per_arm=60, first_day=8, lrp_path=str(lrp_dir), eval_users=200
    )


def bound(lrp_dir, turns: int):
    task = live_task(lrp_dir)
    env = EditorEnvironment()
    env.bind(task.env, turns)
    return task, env


def play(env: EditorEnvironment, task, turns: list[str]) -> str:
    """One episode of `turns` (ended by the environment or, like the token budget, by
    running out of turns); its text as the rollout holds it."""
    episode = env.start(task.format_prompt(task.rows("train")[0]))
    text = ""
    for turn in turns:
        text += turn
        reply = episode.step(turn)
        if reply.done:
            break
        text += "".join(env.plain_text(m) for m in reply.messages)
    return text


def world_state(task):
    env = task.env
    return (env.day, env.document.render(), list(env.recent), len(env.log), len(env.experiments))


E1, E2, E3 = (
    "replace ads 1: keep ad load low\n",
    "delete budget 1\n",
    "insert loyal: keep ad load low\n",
)


def test_the_environment_is_registered_and_needs_a_world():
    assert ENVIRONMENTS.get("dmrl_editor") is EditorEnvironment
    with pytest.raises(ValueError, match="has no live world"):
        EditorEnvironment().start("[ads]\n1. keep ad load low\nrecent:\nnone\nedit:\n")


def test_the_episode_edits_its_own_copy(lrp_dir):
    task, env = bound(lrp_dir, 3)
    before = world_state(task)
    d0 = task.env.document
    episode = env.start(task.env.prompt())
    r1 = episode.step(E1)
    assert not r1.done and r1.messages[0]["role"] == "user"
    assert r1.messages[0]["content"].startswith("lift ") and r1.messages[0]["content"].endswith(CUE)
    d1 = d0.apply(parse_edit(E1, d0))
    assert episode.document == d1 and task.env.document == d0
    episode.step(E2)
    d2 = d1.apply(parse_edit(E2, d1))
    assert episode.document == d2
    r3 = episode.step(E3)  # the third of 3 turns: the environment ends the episode
    assert r3.done and r3.messages == ()
    assert episode.document == d2.apply(parse_edit(E3, d2))
    assert world_state(task) == before  # episodes change no part of the world
    assert [t.text for t in task.env.played[0]] == [E1, E2, E3]


def test_the_reply_is_the_one_edit_reward_of_the_same_edit(lrp_dir):
    task, env = bound(lrp_dir, 3)
    episode = env.start(task.env.prompt())
    reply = episode.step(E1).messages[0]["content"]
    # turn 1: the one-edit step's reward of that edit alone, on an unbound twin world
    twin = live_task(lrp_dir)
    out = LRPReward(twin)(["p"], [E1])
    lift1 = twin.env.scored.best[1]  # the scored edit's predicted lift
    assert out.rewards[0] / float(out.structure["control_rewards"][0]) - 1 == pytest.approx(
        lift1, rel=1e-5
    )
    assert reply == f"lift {lift1 * 100:+.1f}%\n{CUE}"
    d0 = task.env.document
    d1 = d0.apply(parse_edit(E1, d0))
    assert env.lift(d0, d1) == lift1
    # turn 2, by hand: the day's multi-arm test, one treatment arm, the episode's document
    # (after turn 1) as its control, the LRP's per-population values weighted by its mix
    reply2 = episode.step(E2).messages[0]["content"]
    d2 = d1.apply(parse_edit(E2, d1))
    world, agent = task.env, task.env.agent
    (exp,) = world.platform.multi_arm_test(
        ONLINE_ID_BASE + 1000 * world.day, world.start_day, agent(d1), [agent(d2)]
    )
    model, bank = load_lrp(lrp_dir)
    pv = Scorer(str(lrp_dir), model, bank, EditCost()).pop_values(world, [exp])[0]  # [2, 4]
    w = exp.weights()
    lift2 = float(pv[1] @ w) / float(pv[0] @ w) - 1.0
    assert env.lift(d1, d2) == pytest.approx(lift2, rel=1e-9)
    assert reply2 == f"lift {lift2 * 100:+.1f}%\n{CUE}"


def test_a_malformed_or_unfinished_edit_is_a_reply(lrp_dir):
    task, env = bound(lrp_dir, 4)
    episode = env.start(task.env.prompt())
    d0 = task.env.document
    assert episode.step("replace ads 9: keep ad load low\n").messages[0]["content"] == (
        "malformed\n" + CUE
    )
    assert episode.step("~~ {} \x00 non\nsense").messages[0]["content"] == "\nmalformed\n" + CUE
    assert episode.step("delete ads 1").messages[0]["content"] == "\ntruncated\n" + CUE
    assert episode.document == d0  # nothing applied


def test_scoring_episodes_twice_gives_the_same_and_leaves_the_world(lrp_dir):
    task, env = bound(lrp_dir, 3)
    texts = [
        play(env, task, [E1, E2, E3]),
        play(env, task, ["garbage\n", E2, "replace ranking 1: set quality weight hi"]),
        play(env, task, [E1, E2, E3]),  # the same episode: the same arm
        play(env, task, ["x\n", "y\n", "z"]),  # no well-formed edit
        play(env, task, [E2, "insert budget: pace budgets low\n", "delete budget 1\n"]),
    ]
    before = world_state(task)
    reward = LRPReward(task)
    out = reward(["p"] * 5, texts)
    assert world_state(task) == before
    again = reward(["p"] * 5, texts)
    assert again.rewards == out.rewards
    assert torch.equal(again.structure["edit_costs"], out.structure["edit_costs"])
    assert LRPReward(task)(["p"] * 5, texts).rewards == out.rewards  # a fresh reward too
    assert world_state(task) == before
    r, s = out.rewards, out.structure
    r0, p = float(s["control_rewards"][0]), task.env.invalid_penalty
    assert r[0] == r[2]
    assert r[3] == pytest.approx(r0 * (1 - 3 * p)) and s["edit_costs"][3] == 0
    # episode 4 inserts a budget rule after E2 and deletes it again: its final document is
    # E2's alone, and its three edits all cost
    assert s["edit_costs"][4] > s["edit_costs"][1] > 0
    task.end_of_round()
    rec = task.env.log[-1]
    assert task.env.day == 1 and task.env.played == []
    assert (rec["proposals"], rec["turns"]) == (5, 15)
    assert (rec["ok"], rec["malformed"], rec["truncated"]) == (10, 3, 2)
    assert np.isfinite(rec["true_lift"]) and np.isfinite(rec["random_true_lift"])
    lifts = [r[i] / r0 - 1 for i in (0, 4)] + [r[1] / r0 - 1 + 2 * p]
    assert rec["deployed"] == (max(lifts) > task.env.deploy_margin)


def test_the_episode_reward_by_hand(lrp_dir):
    """R = R0 (1 + lift(final) - penalty x invalid turns); C = the sum of its edits' costs."""
    task, env = bound(lrp_dir, 3)
    text = play(env, task, [E1, "nonsense\n", E2])
    out = LRPReward(task)(["p"], [text])
    world = task.env
    d0 = world.document
    d1 = d0.apply(parse_edit(E1, d0))
    d2 = d1.apply(parse_edit(E2, d1))
    (exp,) = world.platform.multi_arm_test(
        ONLINE_ID_BASE + 1000 * world.day, world.start_day, world.control, [world.agent(d2)]
    )
    model, bank = load_lrp(lrp_dir)
    cost = EditCost()
    pv = Scorer(str(lrp_dir), model, bank, cost).pop_values(world, [exp])[0]
    w = exp.weights()
    r0 = float(pv[0] @ w)
    lift = float(pv[1] @ w) / r0 - 1.0
    assert float(out.structure["control_rewards"][0]) == pytest.approx(r0, rel=1e-6)
    assert out.rewards[0] == pytest.approx(r0 * (1 + lift - world.invalid_penalty), rel=1e-6)
    c1 = float(cost(["ads"], ["replace"], [d0.section_text("ads")], [d1.section_text("ads")]))
    c2 = float(cost(["budget"], ["delete"], [d1.section_text("budget")], [""]))
    assert float(out.structure["edit_costs"][0]) == pytest.approx(c1 + c2, rel=1e-5)
    task.end_of_round()
    assert world.document == (d2 if world.log[-1]["deployed"] else d0)
    if world.log[-1]["deployed"]:  # the episode's edits, as one change, in the prompt
        assert world.recent[-1].edit == "replace ads 1: keep ad load low; delete budget 1"


ONE_EDITS = [
    "replace ads 1: keep ad load low\n",
    "garbage that is no edit\n",
    "replace ads 1: keep ad load low\n",
    "delete budget 1\n",
    "insert ranking: set quality weight high\n",
    "replace ads 9: keep ad load low\n",
    "replace ranking 1: set quality weight hi",  # no line end: truncated
]


def test_a_one_edit_episode_is_the_one_edit_step(lrp_dir):
    task, env = bound(lrp_dir, 1)
    texts = [play(env, task, [c]) for c in ONE_EDITS]
    assert texts == ONE_EDITS  # one turn, no reply
    n = len(ONE_EDITS)
    episodes = LRPReward(task)(["p"] * n, texts)
    twin = live_task(lrp_dir)
    edits = LRPReward(twin)(["p"] * n, ONE_EDITS)
    assert episodes.rewards == edits.rewards
    for key in ("control_rewards", "edit_costs"):
        assert torch.equal(episodes.structure[key], edits.structure[key])
    task.end_of_round()
    twin.end_of_round()
    a, b = task.env.log[-1], twin.env.log[-1]
    assert a.pop("turns") == n
    assert a == b
    assert task.env.document == twin.env.document
    assert task.env.recent == twin.env.recent


def test_the_turns_of_an_episode_come_from_its_record():
    played = [
        [PlayedTurn("a\n", "lift +1.0%\nedit:\n"), PlayedTurn("b\n", "")],
        [PlayedTurn("a\n", "lift +1.0%\nedit:\n")],  # the budget cut its second turn
        [PlayedTurn("c", "\ntruncated\nedit:\n")],  # no room for turn 2: reply left out
    ]
    assert episode_turns("a\nlift +1.0%\nedit:\nb\n", played) == ["a\n", "b\n"]
    assert episode_turns("a\nlift +1.0%\nedit:\nb\nlif", played) == ["a\n", "b\nlif"]
    assert episode_turns("c", played) == ["c"]
    # a turn may write what a reply says: the record, not the text, says where turns end
    fake = "a\nlift +1.0%\nedit:\nb\n"
    assert episode_turns(fake, [[PlayedTurn(fake, "")]]) == [fake]
    with pytest.raises(ValueError, match="no 'dmrl_editor' episode of today played"):
        episode_turns("d\n", played)


def test_the_episode_budget():
    tok = build_char_tokenizer()
    assert episode_token_budget(tok, 1, 8) == edit_token_budget(tok, 8) == 57
    longest_reply = len(reply_text("x", "ok", -1.0))  # "\nlift -100.0%\nedit:\n"
    assert longest_reply == 20
    # the longest demonstration (47 characters, its newline, EOS) is 49 tokens
    assert episode_token_budget(tok, 3, 8) == 3 * 49 + 2 * longest_reply + 8 == 195


def test_an_edit_sequence_is_its_edits_in_turn():
    from policyopt.envs.ads.skilldoc.document import EditSequence
    from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT

    d0 = START_DOCUMENT
    e1 = parse_edit(E1, d0)
    e2 = parse_edit(E2, d0.apply(e1))
    both = EditSequence((e1, e2))
    assert d0.apply(both) == d0.apply(e1).apply(e2) != d0
    assert both.text() == "replace ads 1: keep ad load low; delete budget 1"
    assert d0.apply(EditSequence(())) == d0
