"""Tasksets written for `verifiers` (0.4: `verifiers.v1`), trained on in-process.

A taskset as the verifiers docs write one runs unchanged: a `vf.Taskset` whose `load()`
yields `vf.Task`s (their `vf.TaskData` with a prompt, their `@vf.reward` methods scoring a
`vf.Trace`), with tools as `@vf.tool` methods of the `vf.Toolset`s that the task class or the
taskset declare (`toolsets`). Named by its id, as `vf eval <id>` takes it (an installed
package, or any importable module, exporting its Taskset subclass in `__all__`):

    task: {name: verifiers, options: {taskset: glossary}}
    rollout:
      strategy: multi_turn
      strategy_options: {environment: verifiers, environment_options: {taskset: glossary}}

`taskset_options` (both places) are the fields of the taskset's `TasksetConfig`.

What runs differently from verifiers' own runner, which starts a harness program in a
runtime (a subprocess or a container, bootstrapped by `uv` over the network) and reaches the
model through an interception server and the tools through MCP servers: here the rollout
strategy `multi_turn` is the harness. The model's turns are the rollout engine's samples,
token for token; a turn's tool calls, in the Hermes format (`<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`, `policyopt.rollout.tool_calls`), go to the toolsets'
`@vf.tool` methods, called in-process under the environment's time limit; a turn without a
call ends the episode. The tools are advertised as verifiers names them (`<prefix>_<tool>`,
the prefix the toolset's `TOOL_PREFIX`). A task's toolsets that set themselves up per task
(`Toolset.setup_task`, which verifiers runs in each rollout's own tool server) get their own
instances in each episode, set up (`setup`, then `setup_task` with a copy of the task's
`vf.TaskData`) with the task of the episode's data row (its `key` column); the taskset's
shared toolsets, and task toolsets without `setup_task`, are set up once and serve every
episode. The task's rewards then score a `vf.Trace` rebuilt from the episode's text (the
prompt, each assistant turn with its calls, each tool result) through `Task.score` without a
runtime (rewards that need one are skipped, as verifiers does offline); their weighted total
is the task reward. The episode's text is split at the tool results as the environment
writes them for a model without a chat template (`<tool_response>...</tool_response>`): keep
the strategy's `chat_template: false`.

Not carried over: a toolset's own `vf.State` subclass (its state channel is a server's; here
each call sees a fresh state), `setup`/`finalize` hooks that need a runtime, judges that call
a model endpoint, and harness features (interception rewrites, compaction, sub-agents).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import re
import traceback
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import datasets
import verifiers.v1 as vf
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, TraceTask
from verifiers.v1.utils.decorators import discover_decorated
from verifiers.v1.utils.generic import concrete_type
from verifiers.v1.utils.loaders import taskset_class

from policyopt.core.user_code import allow_user_code
from policyopt.rollout.environment import ENVIRONMENTS, Episode
from policyopt.rollout.tool_calls import TOOL_CALL_FORMATS, MalformedToolCall
from policyopt.tasks.base import TASKS, Task
from policyopt.tasks.options import split_name
from policyopt.tasks.tool_environment import Tool, ToolEnvironment, ToolEpisode

# A tool's result as the environment writes it (the hermes format's `result_text`).
RESULT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>\n", re.DOTALL)
MAX_TASKS = 100_000  # an infinite taskset is read this far


@lru_cache(maxsize=4)
def load_taskset(taskset: str, options: str) -> tuple[Any, list[Any]]:
    """(the taskset, its tasks in `load()` order) of taskset id `taskset` with its config's
    fields `options` (JSON); loaded once per process.

    The id names a module to import, so it passes the gate of code a config names
    (`core/user_code.py`, principle 1 of docs/guides/reliability.md). A module that cannot
    give its Taskset subclass is a ValueError, which a command prints as one line
    (principle 6): it fails to import (named with its error and where), has no `__all__`,
    or exports no Taskset subclass there (verifiers' own message, which names the module and
    what is missing). An id that names no module is verifiers' ModuleNotFoundError, one line
    too; a module the taskset imports that is not installed is named as that."""
    allow_user_code(f"verifiers taskset {taskset!r}", name=taskset)
    try:
        cls = taskset_class(taskset)
    except (Exception, SystemExit) as error:  # SystemExit: an import must not end the run
        frames = traceback.extract_tb(error.__traceback__)
        if frames and frames[-1].name == "_plugin_class":  # verifiers' check of `__all__`
            raise ValueError(f"verifiers taskset {taskset!r}: {error}") from None
        if isinstance(error, ModuleNotFoundError):
            # verifiers says "not found" for any module missing during the import: the
            # taskset's own module (or package), or one that it imports.
            missing = error.__cause__
            base = taskset.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
            tried = (base, f"verifiers.v1.tasksets.{base}")
            name = getattr(missing, "name", None)
            if not isinstance(missing, ModuleNotFoundError) or any(
                t == name or t.startswith(f"{name}.") for t in tried
            ):
                raise
            error = missing
        if isinstance(error, SyntaxError):
            reason = f"SyntaxError: {error.msg} ({error.filename} line {error.lineno})"
        else:
            frames = traceback.extract_tb(error.__traceback__)
            where = f" at {frames[-1].filename} line {frames[-1].lineno}" if frames else ""
            reason = f"{error!r}{where}"
        raise ValueError(
            f"verifiers taskset {taskset!r}: its module failed to import: {reason}"
        ) from error
    config_cls = concrete_type(cls, vf.TasksetConfig) or vf.TasksetConfig
    loaded = cls(config_cls(id=taskset, **json.loads(options)))
    return loaded, list(itertools.islice(iter(loaded), MAX_TASKS))


def taskset_of(taskset: str, options: Mapping[str, Any] | None) -> tuple[Any, list[Any]]:
    return load_taskset(taskset, json.dumps(dict(options or {}), sort_keys=True))


def run(result: Any) -> Any:
    """The value of a verifiers call, sync or async."""
    return asyncio.run(result) if inspect.isawaitable(result) else result


def prompt_text(data: Any) -> str:
    """A task's system prompt and prompt as one text."""
    parts = [data.system_prompt or "", data.prompt_text]
    return "\n\n".join(p for p in parts if p)


def taskset_tools(loaded: Any) -> list[Tool]:
    """Every `@vf.tool` of the task class's and the taskset's toolsets, named as verifiers
    advertises them (`<prefix>_<tool>`)."""
    return [*toolset_tools(task_toolsets(loaded)), *toolset_tools(shared_toolsets(loaded))]


def task_toolsets(loaded: Any) -> list[Any]:
    """New instances of the task class's toolsets (per rollout, in verifiers)."""
    return list(type(loaded).task_type().toolsets(loaded.config.task))


def shared_toolsets(loaded: Any) -> list[Any]:
    """New instances of the taskset's own toolsets (shared by every rollout, in verifiers)."""
    return list(type(loaded).toolsets(loaded.config))


def sets_up_per_task(toolset: Any) -> bool:
    """Whether a toolset overrides `setup_task` (its tools depend on the rollout's task)."""
    return type(toolset).setup_task is not vf.Toolset.setup_task


def toolset_tools(toolsets: list[Any], task_data: Any = None) -> list[Tool]:
    """The `@vf.tool`s of `toolsets`, each toolset set up first (`setup`; with `task_data`,
    then `setup_task` with it), named as verifiers advertises them (`<prefix>_<tool>`)."""
    tools = []
    for toolset in toolsets:
        run(toolset.setup())
        if task_data is not None:
            run(toolset.setup_task(task_data))
        for fn in discover_decorated(toolset, "tool"):
            bare = getattr(fn, "tool_name", None) or fn.__name__
            name = f"{toolset.server_name}_{bare}" if toolset.server_name else bare
            call = toolset._with_state(fn)  # what its MCP server would run
            tools.append(Tool(_synchronous(call, fn), name))
    return tools


def _synchronous(call: Callable[..., Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    def tool(*args: Any, **kwargs: Any) -> Any:
        return run(call(*args, **kwargs))

    tool.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    tool.__doc__ = fn.__doc__
    return tool


@TASKS.register("verifiers")
class VerifiersTask(Task):
    """A verifiers taskset's tasks as rows; its rewards as the verifier (module docstring).

    eval_size: the first tasks held out for evaluation (0: evaluate on every task, as
    verifiers' own `eval` does; a taskset has no splits); describe_tools: list the tools in
    the prompt's text (for a model without a chat template; a chat template lists them from
    `tools` itself, `train.prompts`)."""

    name = "verifiers"
    solution_column = None

    def __init__(
        self,
        taskset: str,
        taskset_options: Mapping[str, Any] | None = None,
        eval_size: int = 0,
        describe_tools: bool = True,
    ) -> None:
        self.loaded, self.tasks = taskset_of(taskset, taskset_options)
        if not self.tasks:
            raise ValueError(f"verifiers taskset {taskset!r} has no tasks")
        if not 0 <= eval_size < len(self.tasks):
            raise ValueError(
                f"verifiers task: eval_size must be in 0..{len(self.tasks) - 1} for "
                f"{taskset!r}, got {eval_size}"
            )
        self.eval_size = eval_size
        self.by_key = {t.key: t for t in self.tasks}
        self.describe_tools = describe_tools
        self.tools = tuple(t.schema() for t in taskset_tools(self.loaded))
        self.tools_text = "\n".join(json.dumps(s["function"]) for s in self.tools)

    def rows(self, split: str) -> datasets.Dataset:
        split_name("verifiers", split)
        if self.eval_size == 0:
            picked = self.tasks
        elif split == "eval":
            picked = self.tasks[: self.eval_size]
        else:
            picked = self.tasks[self.eval_size :]
        return datasets.Dataset.from_dict(
            {
                "prompt": [prompt_text(t.data) for t in picked],
                "key": [t.key for t in picked],
                "answer": [str(getattr(t.data, "answer", "")) for t in picked],
            }
        )

    def format_prompt(self, row: dict[str, Any]) -> str:
        """The task's prompt; with the tools described as Hermes system prompts do."""
        if not (self.describe_tools and self.tools_text):
            return f"{row['prompt']}\n"
        return (
            'You may call tools, one JSON object per call: <tool_call>{"name": ..., '
            f'"arguments": {{...}}}}</tool_call>. Tools:\n<tools>\n{self.tools_text}\n'
            f"</tools>\n\n{row['prompt']}\n"
        )

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        """The task's weighted reward total on the episode's trace (`Task.score`)."""
        task = self.by_key[row["key"]]
        trace = episode_trace(task, completion)
        run(task.score(trace))
        return float(trace.reward)


def episode_trace(task: Any, completion: str) -> Any:
    """A `vf.Trace` of `task` from the episode's text: the prompt, then each assistant turn
    (the text between tool results) with its Hermes calls, and each tool result."""
    data = task.data
    messages: list[Any] = []
    if data.system_prompt:
        messages.append(vf.SystemMessage(content=data.system_prompt))
    messages.append(vf.UserMessage(content=data.prompt_text))
    sampled = [False] * len(messages)
    turns = RESULT.split(completion)  # turn, result, turn, result, ..., turn
    pending: list[str] = []  # ids of the last turn's calls, answered in order
    for k, piece in enumerate(turns):
        if k % 2:  # a tool's result
            call_id = pending.pop(0) if pending else f"call_{k}"
            messages.append(vf.ToolMessage(tool_call_id=call_id, content=piece))
            sampled.append(False)
            continue
        calls = _calls(piece, k)
        pending = [c.id for c in calls]
        content = piece.split("<tool_call>")[0].strip() if calls else piece.strip()
        messages.append(vf.AssistantMessage(content=content, tool_calls=calls or None))
        sampled.append(True)
    nodes = [
        MessageNode(parent=None if i == 0 else i - 1, message=m, sampled=s)
        for i, (m, s) in enumerate(zip(messages, sampled, strict=True))
    ]
    return vf.Trace(
        task=TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
        agent=AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
    )


def _calls(turn: str, k: int) -> list[Any]:
    try:
        parsed = TOOL_CALL_FORMATS.get("hermes").parse(turn)
    except MalformedToolCall:
        return []
    return [
        vf.ToolCall(id=f"call_{k}_{i}", name=c.name, arguments=json.dumps(c.arguments))
        for i, c in enumerate(parsed)
    ]


@ENVIRONMENTS.register("verifiers")
class VerifiersEnvironment(ToolEnvironment):
    """The taskset's tools behind the Hermes format; a task's toolsets that set themselves
    up per task, set up for the task of each episode's row (module docstring)."""

    def __init__(
        self,
        taskset: str,
        taskset_options: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
        max_calls: int = 4,
    ) -> None:
        self.taskset = taskset
        self.loaded, tasks = taskset_of(taskset, taskset_options)
        self.by_key = {t.key: t for t in tasks}
        toolsets = task_toolsets(self.loaded)
        self.per_task = any(sets_up_per_task(t) for t in toolsets)
        # Without per-task setup these instances serve every episode; with it, they give
        # the tools' schemas and each episode sets up instances of its own.
        self.shared = toolset_tools(shared_toolsets(self.loaded))
        super().__init__(
            [*toolset_tools(toolsets), *self.shared],
            call_format="hermes",
            timeout_s=timeout_s,
            max_calls=max_calls,
        )

    def start(self, prompt: str, row: Mapping[str, Any]) -> Episode:
        """An episode with the taskset's tools; a task's toolsets that set up per task are
        new instances set up with the task of `row["key"]` (the verifiers task's rows)."""
        if not self.per_task:
            return ToolEpisode(self)
        key = row.get("key")
        if key not in self.by_key:
            raise ValueError(
                f"verifiers taskset {self.taskset!r} sets its tools up per task (setup_task): "
                f"an episode needs the 'key' of its task in its row (the verifiers task's "
                f"rows have it), got {key!r}"
            )
        data = self.by_key[key].data.model_copy(deep=True)  # the toolset's own copy
        own = toolset_tools(task_toolsets(self.loaded), data)
        return ToolEpisode(self, {t.name: t for t in [*own, *self.shared]})
