"""A step's prompts: which training rows (`PromptSampler`, a resumable order), their token ids
(the task's prompt format, optionally the chat template), and the responses back to text.

A row whose prompt is a list of chat messages (TRL's conversational format; a task says so
with `prompt_messages(row)`) goes through the tokenizer's chat template as those messages,
whatever `chat` says, as TRL does: there is no other way to hand a model messages, and
turning them into the text "[{'role': 'user', ...}]" would train on that text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from policyopt.config.schema import Config, ConfigError
from policyopt.rollout.base import Rollouts
from policyopt.tasks.base import Task


class PromptSampler:
    """Yields row indices in a fresh seeded permutation each epoch.

    Its whole state is (epoch, position), so a resumed run draws the same prompts as an
    uninterrupted one.
    """

    def __init__(self, n_rows: int, seed: int) -> None:
        if n_rows <= 0:
            raise ValueError("the training split has no rows")
        self.n_rows = n_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n_rows, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.position == self.n_rows:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation()
            step = min(k - len(out), self.n_rows - self.position)
            out.extend(self._order[self.position : self.position + step])
            self.position += step
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._permutation()


def encode_prompts(
    task: Task, tokenizer: Any, rows: list[dict[str, Any]], chat: bool
) -> tuple[list[Any], list[list[int]]]:
    """(prompts, token ids) of `rows`. A prompt is the task's text, or for a conversational
    row its list of messages: what reward functions get as `prompts` and what
    samples.jsonl records (TRL hands reward functions the messages too)."""
    prompts: list[Any] = []
    ids: list[list[int]] = []
    for row in rows:
        messages = task.prompt_messages(row)
        if messages is not None:
            _check_chat_template(tokenizer)
            prompts.append(messages)
            ids.append(_chat_ids(tokenizer, messages, task.tools))
            continue
        text = task.format_prompt(row)
        prompts.append(text)
        if chat:
            ids.append(_chat_ids(tokenizer, [{"role": "user", "content": text}], task.tools))
        else:
            ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts, ids


def _chat_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: tuple[dict[str, Any], ...] = ()
) -> list[int]:
    """The prompt through the chat template, with the task's tools (their JSON schemas) for
    templates that list them (`apply_chat_template(..., tools=...)`)."""
    x = tokenizer.apply_chat_template(
        messages, tools=list(tools) or None, add_generation_prompt=True, tokenize=True
    )
    # Recent transformers return a BatchEncoding (a mapping), older ones a list of ids.
    return list(x["input_ids"]) if hasattr(x, "keys") else list(x)


def check_chat_template(config: Config, tokenizer: Any) -> None:
    """`model.chat_template: true` with a tokenizer that has none (the embedded model's
    character tokenizer) is one line before any work, not transformers' error mid-run."""
    if config.model.chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"model.chat_template: true, but the tokenizer of {config.model.name_or_path!r} "
            "has no chat template; set model.chat_template: false (plain-text prompts)"
        )


def _check_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            "the task's prompts are lists of chat messages (TRL's conversational format), "
            f"which go through the tokenizer's chat template, and the tokenizer of {name!r} "
            "has none: use a chat model's tokenizer, or give the prompts as text"
        )


def decode(tokenizer: Any, rollouts: Rollouts) -> list[str]:
    lengths = rollouts.lengths.tolist()
    return tokenizer.batch_decode(
        [row[:n] for row, n in zip(rollouts.response_ids.tolist(), lengths, strict=True)],
        skip_special_tokens=True,
    )


def check_positions(
    model: Any, tokenizer: Any, task: Any, split: str, rows: Any, config: Config
) -> None:
    """Raise a ValueError naming the first row of `split` whose prompt plus the response
    budget (rollout.max_new_tokens; for eval rows, eval.max_new_tokens when set) exceeds the
    model's positions (`max_position_embeddings`; a model without one is not checked)."""
    setting, budget = "rollout.max_new_tokens", config.rollout.max_new_tokens
    if split == "eval" and config.eval.max_new_tokens:
        setting, budget = "eval.max_new_tokens", config.eval.max_new_tokens
    past = first_row_past_positions(
        model, tokenizer, task, rows, config.model.chat_template, lambda row, bound: budget
    )
    if past is not None:
        n = past.prompt_tokens
        raise ValueError(
            f"{split} row {past.index} (counting from 0): its prompt is {n} tokens, and with "
            f"{setting}={budget} a rollout needs {n + budget} positions, more than the "
            f"{past.limit} of {past.model} (max_position_embeddings); shorten the prompt or "
            f"lower {setting}"
        )


class PastPositions(NamedTuple):
    """A row whose prompt and what follows it need more positions than the model has."""

    index: int  # in the rows given, counting from 0
    row: dict[str, Any]
    prompt_tokens: int
    after_tokens: int
    limit: int  # max_position_embeddings
    model: str  # the model's name, for messages


# The tokens that follow a row's prompt in one sequence (a rollout's response budget, an SFT
# demonstration): exact when the flag is False, else an upper bound that needs no tokenizer
# pass.
After = Callable[[dict[str, Any], bool], int]


def first_row_past_positions(
    model: Any, tokenizer: Any, task: Any, rows: Any, chat: bool, after: After
) -> PastPositions | None:
    """The first of `rows` whose prompt, encoded as the trainer encodes it
    (`encode_prompts`), plus `after(row, False)` tokens exceeds the model's positions
    (`max_position_embeddings`); None if every row fits or the model has no such limit.

    The one measure of the positions a sequence needs, for RL and eval (`check_positions`)
    and SFT (`train.sft.check_sft_positions`)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int) or tokenizer is None:
        return None
    # A token covers at least one UTF-8 byte, so a text prompt of fewer bytes than the room
    # left (less the chat template's own tokens) fits without encoding it.
    templated = bool(getattr(tokenizer, "chat_template", None))
    frame = 0
    if chat and templated:
        # The frame as the prompts are built (`_chat_ids`), the task's tool schemas included:
        # a template that lists them adds their JSON to every prompt.
        empty = [{"role": "user", "content": ""}]
        frame = len(_chat_ids(tokenizer, empty, getattr(task, "tools", ())))
    for index, row in enumerate(each_row(rows)):
        messages = task.prompt_messages(row)
        if messages is not None and not templated:
            continue  # cannot be encoded at all: the first step says why (no chat template)
        text = messages is None and task.format_prompt(row)
        if text and len(text.encode()) + frame + 8 + after(row, True) < limit:
            continue
        n = len(encode_prompts(task, tokenizer, [row], chat)[1][0])
        m = after(row, False)
        if n + m > limit:
            name = getattr(getattr(model, "config", None), "_name_or_path", "") or "the model"
            return PastPositions(index, row, n, m, limit, name)
    return None


def each_row(rows: Any) -> Iterator[dict[str, Any]]:
    """The rows of a `datasets.Dataset` read a column batch at a time (indexing one row at a
    time costs seconds per 20,000 rows), or of a list as they are."""
    if not hasattr(rows, "iter"):
        yield from rows
        return
    for batch in rows.iter(batch_size=4096):
        columns = list(batch)
        for i in range(len(batch[columns[0]]) if columns else 0):
            yield {c: batch[c][i] for c in columns}
