"""Environments: what answers the model's turns in a multi-turn episode.

An environment starts an episode from a prompt and the data row it was built from
(`Environment.start`: the row's columns, such as the answer, the task's id or per-row tool
setup, in the episode's own copy) and answers each of the model's turns (`Episode.step`)
with a `Reply`: the messages the model reads next (a tool's result, an observation, a
user's turn), or the end of the episode, with the environment's own reward if it gives one.
The rollout strategy `multi_turn` (`policyopt.rollout.multiturn`) alternates the model's
turns and the environment's replies in one token sequence per episode, and tokenizes each
reply once: through the model's chat template (a chat model), or as the text
`Environment.plain_text` gives (a model without one, such as the embedded tiny model).

The episode's reward is the reward pipeline's, as for any completion: the task's verifier and
the other reward functions score the episode's text (every turn, the environment's replies
included) with the row's columns. The reward an environment gives at the end
(`Reply(done=True, reward=r)`) reaches the pipeline through the reward function
`environment_reward`.

An environment never raises for what the model wrote: a malformed tool call, a tool that
raises and one that runs past its time limit are replies that say so (`ToolEnvironment`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policyopt.core.registry import Registry, unknown_name_message

# A chat message as `tokenizer.apply_chat_template` takes it: {"role": ..., "content": ...}.
Message = dict[str, Any]

# name -> factory(**options) -> Environment
ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment")


@dataclass(frozen=True)
class Reply:
    """The environment's answer to one model turn: `messages` for the model to read next
    (role "tool" for a tool's result, "user" for an observation), or `done` to end the
    episode (its messages, if any, are not shown to the model), with the environment's
    `reward` for the episode if it scores it (None: it does not; the reward function
    `environment_reward` hands it to the reward pipeline)."""

    messages: tuple[Message, ...] = ()
    done: bool = False
    reward: float | None = None

    def __post_init__(self) -> None:
        if self.reward is None:
            return
        if not self.done:
            raise ValueError(
                "Reply: a reward ends the episode; give it with done=True "
                f"(got reward={self.reward!r} with done=False)"
            )
        if not math.isfinite(float(self.reward)):
            raise ValueError(f"Reply: the reward must be a finite number, got {self.reward!r}")


class Episode(ABC):
    """One episode's state: what the environment remembers between the model's turns."""

    @abstractmethod
    def step(self, turn: str) -> Reply:
        """The reply to the model's turn `turn` (its text, special tokens removed)."""

    def close(self) -> None:  # noqa: B027 - most episodes hold nothing to release
        """The episode ended (by the environment or a budget); release what it holds."""


class Environment(ABC):
    """Starts episodes. `tools` are the JSON schemas of the tools it offers, for the chat
    template (`apply_chat_template(..., tools=tools)`); empty for none."""

    tools: tuple[dict[str, Any], ...] = ()

    @abstractmethod
    def start(self, prompt: str, row: Mapping[str, Any]) -> Episode:
        """A new episode of the prompt `prompt` (the text of its token ids), built from the
        data row `row` (its columns; empty when the caller has no row). The row is the
        episode's own copy: what the environment changes in it reaches nothing else."""

    def plain_text(self, message: Message) -> str:
        """A reply message as the text a model without a chat template reads."""
        return str(message["content"])


class EnvironmentName(str):
    """The name of a registered environment, as an option's annotation: the config check
    (`policyopt.config.check_parts`, which validates options against their annotations)
    refuses an unknown name at load, naming the valid ones."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(cls.check, core_schema.str_schema())

    @staticmethod
    def check(name: str) -> str:
        if name not in ENVIRONMENTS:  # lazy names count: nothing is imported to check
            raise ValueError(unknown_name_message("environment", name, ENVIRONMENTS.names()))
        return name


def get_environment(name: str, **options: Any) -> Environment:
    """Build the registered environment `name` with its options."""
    return ENVIRONMENTS.get(name)(**options)
