"""Tool calls in a model's turn: parsing them, and the text of a call and of a result.

A format reads the calls a model wrote in one turn (`ToolCallFormat.parse`), writes a call as
the model would (`call_text`, for demonstrations) and writes a tool's result as a model
without a chat template reads it (`result_text`; a chat model reads results through its
chat template instead). Registered formats:

- `hermes`: JSON in tags, the format of Hermes, Qwen 2.5/3 and SmolLM3 chat templates:
  `<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>`, any
  number per turn; a result reads `<tool_response>5</tool_response>`.
- `call`: one call per turn as `name(argument)`, the whole turn, with a single argument that
  goes to the tool's first parameter: `calc(47*36+18)`; a result reads `=1710` and a newline.
  Short enough for the embedded character-level model.

A turn that tries to call a tool and fails (an unclosed tag, invalid JSON, no name) raises
`MalformedToolCall`, whose message says what is wrong; the environment shows it to the model
as the turn's result, so that a malformed call is an observation, never a crash. A turn with
no call at all parses to no calls: the model's final answer.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from policyopt.core.registry import Registry


@dataclass(frozen=True)
class ToolCall:
    """A call of tool `name`: keyword `arguments`, or one positional argument (a str)."""

    name: str
    arguments: dict[str, Any] | str


class MalformedToolCall(ValueError):
    """A turn tried to call a tool and the call cannot be read; the message says why."""


class ToolCallFormat(ABC):
    """How a model writes tool calls and reads their results (module docstring)."""

    @abstractmethod
    def parse(self, turn: str) -> list[ToolCall]:
        """The calls in `turn` ([] for none); `MalformedToolCall` for an unreadable one."""

    @abstractmethod
    def call_text(self, call: ToolCall) -> str:
        """`call` as the model writes it."""

    @abstractmethod
    def result_text(self, content: str) -> str:
        """A tool's result `content` as a model without a chat template reads it."""


# name -> ToolCallFormat
TOOL_CALL_FORMATS: Registry[ToolCallFormat] = Registry("tool-call format")


class HermesFormat(ToolCallFormat):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more per turn."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def parse(self, turn: str) -> list[ToolCall]:
        calls = []
        rest = turn
        while (start := rest.find(self.OPEN)) >= 0:
            end = rest.find(self.CLOSE, start)
            if end < 0:
                raise MalformedToolCall(f"{self.OPEN} without a closing {self.CLOSE}")
            body = rest[start + len(self.OPEN) : end]
            calls.append(self._call(body, len(calls) + 1))
            rest = rest[end + len(self.CLOSE) :]
        if self.CLOSE in rest:
            raise MalformedToolCall(f"{self.CLOSE} without an opening {self.OPEN}")
        return calls

    def _call(self, body: str, k: int) -> ToolCall:
        try:
            value = json.loads(body)
        except json.JSONDecodeError as err:
            raise MalformedToolCall(f"tool call {k} is not valid JSON: {err.msg}") from None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise MalformedToolCall(f'tool call {k} needs a "name" string')
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                raise MalformedToolCall(f"tool call {k}: arguments are not a JSON object") from None
        if not isinstance(arguments, dict):
            raise MalformedToolCall(f'tool call {k}: "arguments" must be a JSON object')
        return ToolCall(value["name"], arguments)

    def call_text(self, call: ToolCall) -> str:
        if isinstance(call.arguments, str):
            raise ValueError("the hermes format writes keyword arguments, not a positional one")
        body = json.dumps({"name": call.name, "arguments": call.arguments})
        return f"{self.OPEN}\n{body}\n{self.CLOSE}"

    def result_text(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>\n"


class CallFormat(ToolCallFormat):
    """The whole turn is `name(argument)` (surrounding whitespace aside)."""

    START = re.compile(r"\s*([A-Za-z_]\w*)\(")

    def parse(self, turn: str) -> list[ToolCall]:
        start = self.START.match(turn)
        if start is None:
            return []
        text = turn.strip()
        if not text.endswith(")"):
            raise MalformedToolCall(f"a call is {start.group(1)}(argument), ending with ')'")
        return [ToolCall(start.group(1), text[len(start.group(1)) + 1 : -1])]

    def call_text(self, call: ToolCall) -> str:
        if not isinstance(call.arguments, str):
            raise ValueError("the call format writes one positional argument")
        return f"{call.name}({call.arguments})"

    def result_text(self, content: str) -> str:
        return f"={content}\n"


TOOL_CALL_FORMATS.register("hermes")(HermesFormat())
TOOL_CALL_FORMATS.register("call")(CallFormat())
