"""An environment starts each episode from its data row (its own copy) and may end it with a
reward, which reaches the reward pipeline through the `environment_reward` function."""

import copy
import math

import pytest
import torch

from episodes_for_tests import ScriptedEngine
from policyopt.config.load import load_config
from policyopt.core.structure import MissingStructureError, needs
from policyopt.models.loading import load_tokenizer
from policyopt.rewards.functions import RewardPipeline, build_reward_pipeline
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.environment import ENVIRONMENTS, Environment, Episode, Reply
from policyopt.rollout.multiturn import environment_of, held_out_rollouts, multi_turn, run_episodes
from policyopt.train.prompts import decode
from run_configs import sampled_round, small_overrides


class AnswerChecker(Environment):
    """Ends an episode when a turn is the row's answer, with reward 10 x row id + turns
    taken; replies `=no` to any other turn. Mutates every row it gets (a careless
    environment) and keeps what each row held when its episode started."""

    def __init__(self) -> None:
        self.started: list[dict] = []

    def start(self, prompt: str, row) -> Episode:  # noqa: ANN001
        self.started.append(copy.deepcopy(dict(row)))
        answer, base = row["answer"], 10.0 * row["id"]
        row["answer"] = "corrupted"
        row["tags"].append("corrupted")

        class _Episode(Episode):
            turns = 0

            def step(self, turn: str) -> Reply:
                self.turns += 1
                if turn == answer:
                    return Reply(done=True, reward=base + self.turns)
                return Reply(messages=({"role": "user", "content": "=no\n"},))

        return _Episode()


class RowReward(Environment):
    """Ends every episode at its first turn with the row's answer as its reward, after
    overwriting the answer in the row it was given."""

    def start(self, prompt: str, row) -> Episode:  # noqa: ANN001
        reward = float(row["answer"])
        row["answer"] = "corrupted"

        class _Episode(Episode):
            def step(self, turn: str) -> Reply:
                return Reply(done=True, reward=reward)

        return _Episode()


for _name, _cls in (
    ("answer_checker_for_tests", AnswerChecker),
    ("row_reward_for_tests", RowReward),
):
    if _name not in ENVIRONMENTS:
        ENVIRONMENTS.register(_name)(_cls)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def rows() -> list[dict]:
    return [{"id": 0, "answer": "7", "tags": ["a"]}, {"id": 1, "answer": "12", "tags": ["b"]}]


def checked_episodes(tok):
    """Two prompts, two episodes each: episode 0 answers at turn 1, 1 at turn 2, 2 at turn 1,
    3 never (cut by max_turns = 2)."""
    engine = ScriptedEngine(
        tok, [["7</s>", "3</s>", "12</s>", "5</s>"], ["", "7</s>", "", "6</s>"]]
    )
    given = rows()
    env = environment_of("answer_checker_for_tests", None)
    env.started.clear()
    r, index = multi_turn(
        engine,
        [ids(tok, "Q:a"), ids(tok, "Q:b")],
        SamplingParams(max_new_tokens=20),
        group_size=2,
        rows=given,
        environment="answer_checker_for_tests",
        max_turns=2,
    )
    return r, index, env, given


def test_an_environment_starts_from_its_row(tok):
    r, index, env, _ = checked_episodes(tok)
    assert index.tolist() == [0, 0, 1, 1]
    assert decode(tok, r) == ["7", "3=no\n7", "12", "5=no\n6"]  # replies read row["answer"]
    # every episode got its prompt's row, as it was: G episodes share the row, not a copy
    # another episode changed
    assert env.started == [rows()[0], rows()[0], rows()[1], rows()[1]]


def test_an_environment_cannot_change_the_caller_s_rows(tok):
    *_, given = checked_episodes(tok)
    assert given == rows()  # the rows the reward functions' columns are read from


def test_the_environment_s_reward_reaches_environment_reward_in_order(tok):
    r, *_ = checked_episodes(tok)
    expected = torch.tensor([1.0, 2.0, 11.0, math.nan], dtype=torch.float64)
    torch.testing.assert_close(r.structure["environment_reward"], expected, equal_nan=True)
    assert r.truncated.tolist() == [False, False, False, True]
    pipeline = build_reward_pipeline([("environment_reward", 1.0)])
    n = len(r)
    result = pipeline(["q"] * n, decode(tok, r), {}, structure=r.structure)
    # the episode cut by max_turns has no environment reward: None, scored 0, unparseable
    assert result.raw["environment_reward"] == [1.0, 2.0, 11.0, None]
    assert result.unparseable["environment_reward"] == 1
    assert result.total.tolist() == [1.0, 2.0, 11.0, 0.0]


def test_an_episode_ended_without_a_reward_has_none(tok):
    class NoReward(Environment):
        def start(self, prompt: str, row) -> Episode:  # noqa: ANN001
            class _Episode(Episode):
                def step(self, turn: str) -> Reply:
                    return Reply(done=True)

            return _Episode()

    r, _ = run_episodes(
        ScriptedEngine(tok, [["a</s>"]]),
        NoReward(),
        [ids(tok, "Q:")],
        SamplingParams(),
        max_turns=2,
    )
    assert math.isnan(float(r.structure["environment_reward"][0]))


def test_run_episodes_gives_each_episode_its_row_or_an_empty_one(tok):
    seen = []

    class Recorder(Environment):
        def start(self, prompt: str, row) -> Episode:  # noqa: ANN001
            seen.append(dict(row))

            class _Episode(Episode):
                def step(self, turn: str) -> Reply:
                    return Reply(done=True)

            return _Episode()

    engine = ScriptedEngine(tok, [["a</s>", "b</s>"]])
    run_episodes(engine, Recorder(), [ids(tok, "Q:")] * 2, SamplingParams(), max_turns=1)
    assert seen == [{}, {}]
    with pytest.raises(ValueError, match="2 prompts but 1 rows"):
        run_episodes(
            ScriptedEngine(tok, [["a</s>", "b</s>"]]),
            Recorder(),
            [ids(tok, "Q:")] * 2,
            SamplingParams(),
            max_turns=1,
            rows=[{"answer": "1"}],
        )


def test_held_out_episodes_start_from_their_rows(tok):
    env = environment_of("answer_checker_for_tests", None)
    env.started.clear()
    given = rows()
    r = held_out_rollouts(
        ScriptedEngine(tok, [["7</s>", "12</s>"]]),
        [ids(tok, "Q:a"), ids(tok, "Q:b")],
        SamplingParams(max_new_tokens=20, greedy=True),
        rows=given,
        environment="answer_checker_for_tests",
        max_turns=2,
    )
    assert env.started == rows() and given == rows()
    assert r.structure["environment_reward"].tolist() == [1.0, 11.0]


def test_a_reward_ends_the_episode_and_is_a_finite_number():
    assert Reply(done=True, reward=0.5).reward == 0.5
    with pytest.raises(ValueError, match="a reward ends the episode"):
        Reply(messages=({"role": "user", "content": "x"},), reward=1.0)
    with pytest.raises(ValueError, match="finite number"):
        Reply(done=True, reward=math.inf)


def test_reward_functions_get_the_structure_they_need_as_keyword_lists():
    seen = {}

    @needs("environment_reward")
    def reads(completions, environment_reward, **kwargs):  # noqa: ANN001, ANN003
        seen["values"] = list(environment_reward)
        environment_reward[0] = 99.0  # its own copy: the batch's structure stays
        return [0.0] * len(completions)

    structure = {"environment_reward": torch.tensor([0.5, 1.0], dtype=torch.float64)}
    pipeline = RewardPipeline([("reads", reads, 1.0)])
    pipeline(["q", "q"], ["a", "b"], {"answer": ["1", "2"]}, structure=structure)
    assert seen["values"] == [0.5, 1.0]
    assert structure["environment_reward"].tolist() == [0.5, 1.0]
    with pytest.raises(MissingStructureError, match="reward function 'reads' needs"):
        pipeline(["q", "q"], ["a", "b"], {})
    with pytest.raises(ValueError, match="column 'environment_reward' clashes"):
        pipeline(["q", "q"], ["a", "b"], {"environment_reward": [1, 2]}, structure=structure)


def test_environment_reward_without_multi_turn_is_refused_at_load(tmp_path):
    functions = "reward.functions=[{name: task}, {name: environment_reward}]"
    with pytest.raises(MissingStructureError) as refused:
        load_config(overrides=[f"train.output_dir={tmp_path}", functions])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("reward function 'environment_reward' needs 'environment_reward'")
    assert "rollout strategy 'multi_turn'" in message
    config = load_config(
        overrides=[
            f"train.output_dir={tmp_path}",
            functions,
            "rollout.strategy=multi_turn",
            "rollout.strategy_options={environment: calculator}",
        ]
    )
    assert [f.name for f in config.reward.functions] == ["task", "environment_reward"]


@pytest.mark.slow
def test_a_training_round_scores_the_environment_s_reward(tmp_path):
    """The trainer's rollout stage hands each prompt's row to the environment, whose reward
    reaches `environment_reward`; the environment's edits reach neither the rows nor the
    columns the reward functions read."""
    from policyopt.train.trainer import Trainer

    config = load_config(
        overrides=[
            *small_overrides(tmp_path, 1),
            "reward.functions=[{name: 'rewards_for_tests:digit_fraction'}, "
            "{name: environment_reward}]",
            "rollout.strategy=multi_turn",
            # turns of 4 tokens: each ends before the episode's budget, and the environment scores it
            "rollout.strategy_options={environment: row_reward_for_tests, max_turns: 2, "
            "max_turn_tokens: 4}",
        ]
    )
    trainer = Trainer(config)
    try:
        answers = [trainer.state.rows[i]["answer"] for i in (0, 1)]
        batch = sampled_round(trainer, [0, 1])
        expected = [float(a) for a in answers for _ in range(4)]
        assert batch.rewards["function/environment_reward"].tolist() == expected
        assert batch.columns["answer"] == [a for a in answers for _ in range(4)]
        assert [trainer.state.rows[i]["answer"] for i in (0, 1)] == answers
    finally:
        trainer.close()


def test_held_out_evaluation_scores_the_environment_s_reward(tok):
    """`policyopt eval`'s weighted reward: the episodes start from the held-out rows, and
    the run's `environment_reward` reads what their environment gave."""
    from functools import partial

    from policyopt.tasks import get_task
    from policyopt.train.held_out import evaluate

    task = get_task("arithmetic", train_size=10, eval_size=4)
    held_out = task.rows("eval")
    out = evaluate(
        task=task,
        rows=held_out,
        tokenizer=tok,
        engine=ScriptedEngine(tok, [["A:1</s>"] * len(held_out)]),
        max_new_tokens=20,
        correct_threshold=0.5,
        reward_fn=build_reward_pipeline([("environment_reward", 1.0)]),
        generate=partial(held_out_rollouts, environment="row_reward_for_tests", max_turns=2),
    )
    answers = [float(row["answer"]) for row in held_out]
    assert out["eval/weighted_reward"] == pytest.approx(sum(answers) / len(answers))
