"""How a reward function is called: TRL's convention, on its own copies of the inputs.

By keyword (`f(prompts=..., completions=..., completion_ids=..., trainer_state=...,
**columns)`) when the function's parameters allow, else positionally; with only the extra
arguments it takes; on its own deep copies of every input, so that what it edits reaches no
other function and not the logged samples; with a conversational prompt's completion as TRL
gives it (`[{"role": "assistant", "content": text}]`). The in-process pipeline
(`rewards.functions`) and the Ray workers (`rewards.remote`) both call through here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policyopt.rewards import isolation

RewardFunction = Callable[..., Any]


def is_conversational(prompt: Any) -> bool:
    """Whether `prompt` is a list of chat messages (TRL's conversational format)."""
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


def completion_text(completion: Any) -> str:
    """The text of a completion: itself, or the content of a conversational completion's
    last message."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    return completion


def keyword_style(fn: Callable[..., Any]) -> tuple[bool, set[str] | None]:
    """(call by keyword, the keywords it takes: None for any). By keyword, as TRL does, when
    `completions` has that name and `prompts` can be passed too (by name or **kwargs);
    otherwise positionally (e.g. `lambda p, c, **k`)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return False, None
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    by_keyword = "completions" in named and ("prompts" in named or any_keyword)
    return by_keyword, None if any_keyword else named


def call_reward_function(
    fn: Callable[..., Any], prompts: list[Any], completions: list[Any], **columns: Any
) -> Any:
    """Call `fn` as the pipeline does (TRL's way, by keyword, when its parameters allow; on
    its own copies of the inputs; conversational completions for conversational prompts)
    and return what it returns, unchecked. `score_reward_function` also checks it."""
    return Call(fn, *keyword_style(fn), {})(prompts, completions, **columns)


def own_inputs(
    prompts: list[Any], completions: list[Any], columns: dict[str, Any]
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """What one call gets: its own copies of everything (`isolation.own_copy`), with a
    conversational prompt's completion as TRL gives it, `[{"role": "assistant", "content":
    text}]`."""
    completions = [
        [{"role": "assistant", "content": c}] if isinstance(c, str) and is_conversational(p) else c
        for p, c in zip(prompts, completions, strict=True)
    ]
    return (
        isolation.own_copy(prompts),
        isolation.own_copy(completions),
        {k: isolation.own_copy(v) for k, v in columns.items()},
    )


EXTRA_ARGUMENTS = ("completion_ids", "trainer_state")


@dataclass
class Call:
    """One reward function called TRL's way (by keyword, with `completion_ids` and
    `trainer_state`) or positionally, with only the extra arguments it takes."""

    fn: RewardFunction
    by_keyword: bool
    accepts: set[str] | None
    extra: dict[str, Any]

    def __call__(
        self, prompts: list[Any], completions: list[Any], _sample: int | None = None, **columns: Any
    ) -> Any:
        extra = {
            k: isolation.own_copy(v if _sample is None or k != "completion_ids" else [v[_sample]])
            for k, v in self.extra.items()
            if self.accepts is None or k in self.accepts
        }
        prompts, completions, columns = own_inputs(prompts, completions, columns)
        if self.by_keyword:
            return self.fn(prompts=prompts, completions=completions, **extra, **columns)
        return self.fn(prompts, completions, **extra, **columns)
