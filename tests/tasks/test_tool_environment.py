"""Tools behind an environment: results, and every failure an observation that ends cleanly."""

import sys
import time

import pytest

from episodes_for_tests import ScriptedEngine
from policyopt.models.loading import load_tokenizer
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.multiturn import run_episodes
from policyopt.tasks.tool_arithmetic import calc
from policyopt.tasks.tool_environment import Tool, ToolEnvironment
from policyopt.train.prompts import decode


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Longer text that the schema leaves out."""
    return a + b


def broken(expression: str) -> str:
    raise RuntimeError("the tool broke")


def hangs(expression: str) -> str:
    time.sleep(30)
    return "never"


def leaves(expression: str) -> str:
    sys.exit(3)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def test_a_tool_schema_comes_from_its_signature_and_docstring():
    assert Tool.of(add).schema() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a"],
            },
        },
    }


def test_results_and_failures_are_tool_messages():
    env = ToolEnvironment([add, broken, hangs, leaves], timeout_s=0.2, max_calls=2)
    episode = env.start("Q", {})

    def call(name: str, args: str) -> str:
        return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'

    def contents(turn: str) -> list[str]:
        return [m["content"] for m in episode.step(turn).messages]

    assert contents(call("add", '{"a": 2, "b": 3}')) == ["5"]
    assert contents(call("sub", "{}")) == [
        "error: unknown tool 'sub'; tools: add, broken, hangs, leaves"
    ]
    assert contents(call("add", '{"c": 1}'))[0].startswith("error: TypeError: ")
    assert contents(call("broken", '{"expression": "1"}')) == [
        "error: RuntimeError: the tool broke"
    ]
    start = time.perf_counter()
    assert contents(call("hangs", '{"expression": "1"}')) == [
        "error: hangs did not return within 0.2 s"
    ]
    assert time.perf_counter() - start < 5
    assert contents(call("leaves", '{"expression": "1"}')) == ["error: SystemExit: 3"]
    assert contents("<tool_call>{oops}</tool_call>") == [
        "error: tool call 1 is not valid JSON: Expecting property name enclosed in double quotes"
    ]
    three = call("add", '{"a": 1}') * 3
    assert contents(three) == ["1", "1", "error: at most 2 calls per turn"]
    assert episode.step("It is 5.").done


@pytest.mark.parametrize(
    ("first", "reply"),
    [
        ("calc(2*3", "=error: a call is calc(argument), ending with ')'\n"),
        ("calc(1/0)", "=error: ZeroDivisionError: division by zero\n"),
        ("calc(2**3)", "=error: ValueError: not an arithmetic expression: '2 ** 3'\n"),
        ("calc(hang)", "=error: calc did not return within 0.2 s\n"),
    ],
)
def test_malformed_raising_and_hanging_calls_end_their_episode_cleanly(tok, first, reply):
    """The failure is the model's observation; the episode goes on and ends as usual."""

    def slow_calc(expression: str) -> str:
        if expression == "hang":
            time.sleep(30)
        return calc(expression)

    env = ToolEnvironment([Tool(slow_calc, "calc")], call_format="call", timeout_s=0.2)
    engine = ScriptedEngine(tok, [[f"{first}</s>"], ["A:6</s>"]])
    prompt = tok("Q:2*3=?\n", add_special_tokens=False)["input_ids"]
    r, turns = run_episodes(engine, env, [prompt], SamplingParams(max_new_tokens=80), max_turns=3)
    assert decode(tok, r) == [f"{first}{reply}A:6"]
    assert turns == [2] and r.truncated.tolist() == [False]
    n_reply = len(tok(reply, add_special_tokens=False)["input_ids"])
    assert int((r.response_mask == 0).sum()) == n_reply  # the observation is masked out


def test_the_calculator():
    assert calc("47*36+18") == "1710"
    assert calc(" (2+3)*-4 ") == "-20"
    assert calc("7/2") == "3.5"
    assert calc("1/3") == "0.333333"
    for bad in ("", "2+", "__import__('os')", "x*2", "2**100", "1e5", "'a'*3"):
        with pytest.raises(ValueError, match="not an arithmetic expression"):
            calc(bad)
    with pytest.raises(ValueError, match="longer than 200"):
        calc("1+" * 100 + "1")
