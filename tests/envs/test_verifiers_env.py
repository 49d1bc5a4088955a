"""A verifiers tool taskset, unchanged, in multi-turn rollouts and a `policyopt train` run."""

import pytest

pytest.importorskip("verifiers.v1")

from episodes_for_tests import ScriptedEngine  # noqa: E402
from policyopt.config.load import load_config  # noqa: E402
from policyopt.models.loading import load_tokenizer  # noqa: E402
from policyopt.rollout.base import SamplingParams  # noqa: E402
from policyopt.rollout.multiturn import environment_of, run_episodes  # noqa: E402
from policyopt.tasks import get_task  # noqa: E402
from policyopt.train.prompts import decode  # noqa: E402
from policyopt.train.trainer import Trainer  # noqa: E402
from run_configs import small_overrides  # noqa: E402

TASKSET = "glossary_taskset_for_tests"
LOOKUP = '<tool_call>{"name": "facts_lookup", "arguments": {"name": "Ada Lovelace"}}</tool_call>'


@pytest.mark.slow
def test_the_taskset_s_tools_answer_and_its_reward_scores_the_episode():
    task = get_task("verifiers", taskset=TASKSET)
    rows = task.rows("train")
    assert len(rows) == 3 and rows[0]["answer"] == "the first computer program"
    assert '"name": "facts_lookup"' in task.format_prompt(rows[0])  # the tools, described
    tok = load_tokenizer("tiny")
    prompt = tok(task.format_prompt(rows[0]), add_special_tokens=False)["input_ids"]
    engine = ScriptedEngine(
        tok,
        [[f"{LOOKUP}</s>", "A guess</s>"], ["It is the first computer program.</s>", "x"]],
    )
    r, turns = run_episodes(
        engine,
        environment_of("verifiers", {"taskset": TASKSET}),
        [prompt, prompt],
        SamplingParams(max_new_tokens=300),
        max_turns=3,
    )
    looked_up, guessed = decode(tok, r)
    result = "<tool_response>\nthe first computer program\n</tool_response>\n"
    assert looked_up == f"{LOOKUP}{result}It is the first computer program."
    assert guessed == "A guess" and turns == [2, 1]
    assert task.verify(looked_up, rows[0]) == 1.0  # the task's own @vf.reward, on the trace
    assert task.verify(guessed, rows[0]) == 0.0
    assert task.verify(f"{LOOKUP}{result}I do not know.", rows[0]) == 0.0


@pytest.mark.slow
def test_a_verifiers_taskset_trains_by_name(tmp_path):
    config = load_config(
        overrides=[
            *small_overrides(tmp_path, 1),
            "reward.functions=[{name: task}]",
            f"task.options={{taskset: {TASKSET}}}",
            "task.name=verifiers",
            "rollout.strategy=multi_turn",
            "rollout.strategy_options={environment: verifiers, environment_options: "
            f"{{taskset: {TASKSET}}}, max_turns: 2, max_turn_tokens: 8}}",
            "rollout.max_new_tokens=24",
            "eval.size=2",
        ]
    )
    trainer = Trainer(config)
    try:
        metrics = trainer.train()
        assert "loss" in metrics and metrics["leaves"] == 8
        assert "eval/accuracy" in trainer.evaluate()
    finally:
        trainer.close()
