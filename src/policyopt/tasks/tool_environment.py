"""An environment of tools: Python functions the model calls in its turns.

Each model turn is parsed in the environment's tool-call format (`policyopt.rollout.
tool_calls`). A turn without a call ends the episode (it is the model's answer); a turn with
calls gets one "tool" message per call, holding the tool's result. Nothing the model writes
and nothing a tool does ends the run: a malformed call, an unknown tool, arguments the tool
does not take, a tool that raises and one that runs past `timeout_s` each get a result that
says so ("error: ..."), which the model reads like any other.

A tool is a plain function with type hints and a docstring, as in TRL and `verifiers`; its
JSON schema, for the chat template, is built from them (`Tool.schema`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policyopt.rewards.isolation import TimeLimitExceeded, call_with_time_limit
from policyopt.rollout.environment import Environment, Episode, Message, Reply
from policyopt.rollout.tool_calls import TOOL_CALL_FORMATS, MalformedToolCall, ToolCall

# JSON schema types of the annotations a tool's parameters may have.
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass(frozen=True)
class Tool:
    """A function the model can call, under `name`."""

    fn: Callable[..., Any]
    name: str

    @classmethod
    def of(cls, fn: Callable[..., Any], name: str | None = None) -> Tool:
        return cls(fn, name or fn.__name__)

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema `apply_chat_template(tools=...)` takes."""
        params = inspect.signature(self.fn).parameters.values()
        properties = {
            p.name: {"type": _JSON_TYPES.get(p.annotation, "string")}
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }
        required = [
            p.name for p in params if p.name in properties and p.default is inspect.Parameter.empty
        ]
        doc = inspect.getdoc(self.fn) or ""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": doc.split("\n\n")[0].replace("\n", " "),
                "parameters": {"type": "object", "properties": properties, "required": required},
            },
        }

    def __call__(self, arguments: dict[str, Any] | str) -> Any:
        if isinstance(arguments, str):  # a positional argument (the `call` format)
            return self.fn(arguments)
        return self.fn(**arguments)


class ToolEnvironment(Environment):
    """Tools behind a tool-call format (module docstring).

    tools: functions (named by their `__name__`) or `Tool`s; call_format: a name in
    `TOOL_CALL_FORMATS`; timeout_s: how long one call may run; max_calls: calls answered per
    turn (the rest get an error result)."""

    def __init__(
        self,
        tools: Sequence[Callable[..., Any] | Tool],
        *,
        call_format: str = "hermes",
        timeout_s: float = 5.0,
        max_calls: int = 4,
    ) -> None:
        if timeout_s <= 0 or max_calls < 1:
            raise ValueError("a tool environment needs timeout_s > 0 and max_calls >= 1")
        made = [t if isinstance(t, Tool) else Tool.of(t) for t in tools]
        self.by_name = {t.name: t for t in made}
        if len(self.by_name) != len(made):
            raise ValueError(f"tool names must be unique, got {[t.name for t in made]}")
        self.format = TOOL_CALL_FORMATS.get(call_format)
        self.timeout_s = timeout_s
        self.max_calls = max_calls
        self.tools = tuple(t.schema() for t in made)

    def start(self, prompt: str, row: Mapping[str, Any]) -> Episode:
        """An episode of these tools; they are the same for every row."""
        return ToolEpisode(self)

    def plain_text(self, message: Message) -> str:
        return self.format.result_text(str(message["content"]))

    def run(self, call: ToolCall, tools: Mapping[str, Tool] | None = None) -> str:
        """The result of one call as the model reads it: the tool's value, or an error.
        `tools`: the episode's own tools by name (None: the environment's)."""
        by_name = self.by_name if tools is None else tools
        tool = by_name.get(call.name)
        if tool is None:
            return f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(by_name))}"
        try:
            value = call_with_time_limit(
                lambda: tool(call.arguments), self.timeout_s, f"tool {call.name!r}"
            )
        except TimeLimitExceeded:
            return f"error: {call.name} did not return within {self.timeout_s:g} s"
        except (Exception, SystemExit) as err:  # the tool's failure is the model's observation
            return f"error: {type(err).__name__}: {err}"
        return str(value)


class ToolEpisode(Episode):
    """One episode of a `ToolEnvironment`: answers calls until a turn makes none, with the
    environment's tools, or with `tools` (by name) set up for this episode alone."""

    def __init__(self, env: ToolEnvironment, tools: Mapping[str, Tool] | None = None) -> None:
        self.env = env
        self.tools = tools

    def step(self, turn: str) -> Reply:
        try:
            calls = self.env.format.parse(turn)
        except MalformedToolCall as err:
            return Reply(messages=({"role": "tool", "content": f"error: {err}"},))
        if not calls:
            return Reply(done=True)
        messages = []
        for k, call in enumerate(calls):
            if k < self.env.max_calls:
                content = self.env.run(call, self.tools)
            else:
                content = f"error: at most {self.env.max_calls} calls per turn"
            messages.append({"role": "tool", "name": call.name, "content": content})
        return Reply(messages=tuple(messages))
