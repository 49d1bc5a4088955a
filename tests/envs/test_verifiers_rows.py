"""A verifiers taskset whose toolset sets itself up per task (`setup_task`): each episode's
tools are set up with the task of its row, also when episodes of different tasks run
side by side. The module is its own taskset (exported in `__all__`, named by its module)."""

import pytest

vf = pytest.importorskip("verifiers.v1")

from episodes_for_tests import ScriptedEngine  # noqa: E402
from policyopt.models.loading import load_tokenizer  # noqa: E402
from policyopt.rollout.base import SamplingParams  # noqa: E402
from policyopt.rollout.multiturn import environment_of, run_episodes  # noqa: E402
from policyopt.tasks import get_task  # noqa: E402
from policyopt.train.prompts import decode  # noqa: E402

TASKSET = __name__
OPEN = '<tool_call>{"name": "desk_open_drawer", "arguments": {}}</tool_call>'


class DeskToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "desk"

    async def setup_task(self, task) -> None:  # noqa: ANN001
        self.drawer = task.secret

    @vf.tool
    def open_drawer(self) -> str:
        """What the task's drawer holds."""
        return self.drawer


class DeskTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class DeskTaskData(vf.TaskData):
    secret: str


class DeskTask(vf.Task[DeskTaskData, vf.State, DeskTaskConfig]):
    @classmethod
    def toolsets(cls, config: DeskTaskConfig) -> list:
        return [DeskToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(self.data.secret in (trace.last_reply or ""))


class DeskConfig(vf.TasksetConfig):
    task: DeskTaskConfig = DeskTaskConfig()


class DeskTaskset(vf.Taskset[DeskTask, DeskConfig]):
    def load(self) -> list[DeskTask]:
        return [
            DeskTask(
                DeskTaskData(idx=i, prompt="What is in the drawer?", secret=secret),
                self.config.task,
            )
            for i, secret in enumerate(("a key", "a map"))
        ]


__all__ = ["DeskTaskset"]


@pytest.mark.slow
def test_each_episode_s_tools_are_set_up_with_its_row_s_task():
    task = get_task("verifiers", taskset=TASKSET)
    rows = task.rows("train")
    tok = load_tokenizer("tiny")
    prompt = tok(task.format_prompt(rows[0]), add_special_tokens=False)["input_ids"]
    env = environment_of("verifiers", {"taskset": TASKSET})
    r, _ = run_episodes(
        ScriptedEngine(
            tok, [[f"{OPEN}</s>"] * 3, ["It is a map.</s>", "It is a key.</s>", "It is a map.</s>"]]
        ),
        env,
        [prompt] * 3,
        SamplingParams(max_new_tokens=200),
        max_turns=2,
        rows=[rows[1], rows[0], rows[1]],  # tasks side by side, in one round
    )
    secrets = ["a map", "a key", "a map"]
    got = decode(tok, r)
    for text, secret in zip(got, secrets, strict=True):
        assert f"<tool_response>\n{secret}\n</tool_response>\n" in text
    assert [task.verify(t, rows[i]) for t, i in zip(got, (1, 0, 1), strict=True)] == [1.0] * 3
    with pytest.raises(ValueError, match="needs the 'key' of its task in its row"):
        env.start("What is in the drawer?", {})
