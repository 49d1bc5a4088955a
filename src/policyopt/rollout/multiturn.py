"""Multi-turn rollouts: the model's turns and an environment's replies in one token sequence.

The rollout strategy `multi_turn` plays one episode per sample (G per prompt), each started
from its prompt and the data row the prompt was built from (`rows`, which the trainer hands
every strategy; the G episodes of a prompt share its row, each in its own copy, so that an
environment that edits it changes neither the caller's row nor another episode's). Each
round asks the engine for one model turn of every live episode, from the episode's token ids
so far, and hands each turn's text to its episode's environment (`policyopt.rollout.
environment`), whose reply is tokenized once and appended:

    prompt | turn 1 (sampled) | reply 1 (environment) | turn 2 (sampled) | ... | turn K

A model turn ends at EOS or after `max_turn_tokens`; an episode ends when the environment
says so, or is cut (`truncated`) when a budget runs out: `max_turns` model turns, or the
episode's `rollout.max_new_tokens` tokens (model and environment tokens together, so that
every response fits the width every other strategy has).

Token-exact: the rollouts hold the very ids the engine sampled (never the decoded text
re-tokenized) with the engine's log-probs and entropies; the environment's tokens have
response mask 0 (and log-prob and entropy 0), so that no loss, normaliser or diagnostic that
reads the mask counts them, while the policy reads them as it did when sampling
(`Rollouts.attention_mask`: a response's interior zeros are read, only the trailing ones are
padding). Per-turn structure travels as declared structure `turn_ids` [N, R]: k >= 1 on the
k-th model turn and on the environment's reply to it, 0 on padding; the model's own tokens
are those of `response_mask`. The reward an environment ends an episode with
(`Reply(done=True, reward=r)`) travels as declared structure `environment_reward` [N]
(float64; NaN for an episode the environment ended without one, or a budget cut first), which
the reward function `environment_reward` hands to the reward pipeline.

With the environment ending every episode after the first turn, the rollouts are those of
the `parallel` strategy on the same seed, bit for bit (the first round is the same engine
call). What the strategy cannot carry is refused by name: hidden states (GAR's shaper asks
for them; the environment's tokens have none), a grammar-constrained engine (its grammar
state does not span an environment's reply) and engines without a tokenizer.

Replies are tokenized through the chat template (`chat_template: true`, as `model.
chat_template`): the text the template puts after the model's end-of-turn token for those
messages, up to the next assistant header; or as plain text (`Environment.plain_text`).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import torch

from policyopt.core.structure import needs, produces
from policyopt.rollout.base import FinishedFn, RolloutEngine, Rollouts, SamplingParams
from policyopt.rollout.environment import (
    Environment,
    EnvironmentName,
    Episode,
    Message,
    get_environment,
)
from policyopt.rollout.strategies import ROLLOUT_ANNOTATORS, ROLLOUT_STRATEGIES, ScoreFn


@dataclass
class EpisodeTokens:
    """One episode so far: its prompt, its response tokens and what each one is."""

    prompt: list[int]
    state: Episode
    ids: list[int] = field(default_factory=list)
    model: list[float] = field(default_factory=list)  # 1.0: sampled, 0.0: the environment's
    logp: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    truncated: bool = False
    reward: float = math.nan  # the environment's reward at the end; NaN: none given

    def add(self, ids: list[int], logp: list[float], entropy: list[float], turn: int) -> None:
        """A model turn: sampled ids with their log-probs and entropies."""
        self.ids += ids
        self.model += [1.0] * len(ids)
        self.logp += logp
        self.entropy += entropy
        self.turn += [turn] * len(ids)

    def reply(self, ids: list[int], turn: int) -> None:
        """The environment's reply to model turn `turn`."""
        self.ids += ids
        self.model += [0.0] * len(ids)
        self.logp += [0.0] * len(ids)
        self.entropy += [0.0] * len(ids)
        self.turn += [turn] * len(ids)


class PlainReplies:
    """Replies as `Environment.plain_text` writes them, tokenized once."""

    def __init__(self, tokenizer: Any, env: Environment) -> None:
        self.tokenizer, self.env = tokenizer, env

    def __call__(self, messages: tuple[Message, ...]) -> list[int]:
        text = "".join(self.env.plain_text(m) for m in messages)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class ChatReplies:
    """Replies through the chat template: what it writes after the model's end-of-turn
    token (the EOS the engine stopped at) when `messages` follow an assistant turn, with the
    next assistant header (`add_generation_prompt`), tokenized once."""

    # A stand-in conversation: the text after an assistant turn's end does not depend on it.
    BEFORE = ({"role": "user", "content": "?"}, {"role": "assistant", "content": "?"})

    def __init__(self, tokenizer: Any, tools: tuple[dict[str, Any], ...]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "rollout strategy 'multi_turn': chat_template is true but the tokenizer has "
                "no chat template; set chat_template: false to read replies as plain text"
            )
        if not tokenizer.eos_token:
            raise ValueError("rollout strategy 'multi_turn': the tokenizer has no EOS token")
        self.tokenizer, self.tools = tokenizer, list(tools) or None
        self.end = tokenizer.eos_token
        before = self._text(list(self.BEFORE), generation=False)
        cut = before.rfind(self.end)
        if cut < 0:
            raise ValueError(
                f"rollout strategy 'multi_turn': the chat template does not end an assistant "
                f"turn with the EOS token {self.end!r}, at which the engine stops sampling"
            )
        self.prefix = before[: cut + len(self.end)]

    def _text(self, messages: list[Message], generation: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation
        )

    def __call__(self, messages: tuple[Message, ...]) -> list[int]:
        after = self._text([*self.BEFORE, *messages], generation=True)
        if not after.startswith(self.prefix):
            raise ValueError(
                "rollout strategy 'multi_turn': the chat template renders the turns before "
                "a reply differently once the reply follows; cannot append the reply alone"
            )
        text = after[len(self.prefix) :]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def run_episodes(
    engine: RolloutEngine,
    env: Environment,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    max_turns: int,
    max_turn_tokens: int | None = None,
    chat_template: bool = False,
    on_finished: FinishedFn | None = None,
    rows: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[Rollouts, list[int]]:
    """One episode per entry of `prompts`, started from the data row of the same index in
    `rows` (None: an empty row each); (rollouts, model turns of each episode).
    `on_finished(row, response_ids)` hears of each episode the environment ended."""
    tok = _check(engine, params, max_turns, max_turn_tokens)
    if rows is not None and len(rows) != len(prompts):
        raise ValueError(
            f"rollout strategy 'multi_turn': {len(prompts)} prompts but {len(rows)} rows"
        )
    replies = ChatReplies(tok, env.tools) if chat_template else PlainReplies(tok, env)
    budget = params.max_new_tokens
    episodes = [
        EpisodeTokens(
            p,
            env.start(
                tok.decode(p, skip_special_tokens=False),
                {} if rows is None else own_row(rows[i]),
            ),
        )
        for i, p in enumerate(prompts)
    ]
    generated, entropies = 0, True
    live = list(range(len(episodes)))
    turns = [0] * len(episodes)
    try:
        for turn in range(1, max_turns + 1):
            room = [budget - len(episodes[i].ids) for i in live]
            cap = max(room) if max_turn_tokens is None else min(max(room), max_turn_tokens)
            out = engine.generate(
                [episodes[i].prompt + episodes[i].ids for i in live],
                replace(params, max_new_tokens=cap),
            )
            if out.allowed_bits is not None:
                raise ValueError(
                    "rollout strategy 'multi_turn' cannot use a grammar-constrained engine "
                    "(rollout.engine_options.grammar): its grammar does not span the "
                    "environment's replies"
                )
            generated += out.generated_tokens
            entropies = entropies and out.has_entropies
            still = []
            for row, i in enumerate(live):
                turns[i] = turn
                if _play(episodes[i], out, row, budget, turn, max_turns, replies, tok):
                    still.append(i)
                elif on_finished is not None and not episodes[i].truncated:
                    on_finished(i, list(episodes[i].ids))
            live = still
            if not live:
                break
    finally:
        for e in episodes:
            e.state.close()
    return assemble(episodes, engine.pad_id, generated, entropies), turns


def own_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `row` an environment may change freely: each value deep-copied (a value
    that cannot be copied, such as a lock or an open file, is shared as is). The caller's
    row is what the reward functions read as columns, and the G episodes of a prompt share
    it: an environment that edits it must reach neither."""
    out = {}
    for key, value in row.items():
        try:
            out[key] = copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - not copyable: nothing else can be handed over
            out[key] = value
    return out


def _play(
    e: EpisodeTokens,
    out: Rollouts,
    row: int,
    budget: int,
    turn: int,
    max_turns: int,
    replies: Callable[[tuple[Message, ...]], list[int]],
    tok: Any,
) -> bool:
    """Add row `row` of `out` to episode `e` as its model turn `turn`, then the environment's
    reply; whether the episode goes on."""
    room = budget - len(e.ids)
    n = int(out.response_mask[row].sum())  # a single sample is one piece: its mask is a prefix
    keep = min(n, room)  # the engine sampled up to the largest room of the round
    ids = out.response_ids[row, :keep].tolist()
    e.add(ids, out.logp[row, :keep].tolist(), out.entropies[row, :keep].tolist(), turn)
    if keep < n or (bool(out.truncated[row]) and keep == room):
        e.truncated = True  # the episode's token budget ran out inside this turn
        return False
    reply = e.state.step(tok.decode(ids, skip_special_tokens=True))
    if reply.done:
        if reply.reward is not None:
            e.reward = float(reply.reward)
        return False
    answer = replies(reply.messages)
    if turn == max_turns or len(e.ids) + len(answer) >= budget:
        e.truncated = True  # no turn left, or no room for the reply and one more token
        return False
    e.reply(answer, turn)
    return True


def assemble(
    episodes: list[EpisodeTokens], pad_id: int, generated: int, has_entropies: bool
) -> Rollouts:
    """The episodes as rollouts: prompts left-padded, responses right-padded (as engines
    lay them out), `turn_ids` and `environment_reward` as declared structure."""
    n = len(episodes)
    p_width = max(len(e.prompt) for e in episodes)
    width = max(max(len(e.ids) for e in episodes), 1)
    prompt_ids = torch.full((n, p_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p_width), dtype=torch.long)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask, logp, ent = (torch.zeros((n, width)) for _ in range(3))
    turn_ids = torch.zeros((n, width), dtype=torch.long)
    for i, e in enumerate(episodes):
        if e.prompt:
            prompt_ids[i, p_width - len(e.prompt) :] = torch.tensor(e.prompt)
            prompt_mask[i, p_width - len(e.prompt) :] = 1
        k = len(e.ids)
        ids[i, :k] = torch.tensor(e.ids, dtype=torch.long)
        mask[i, :k] = torch.tensor(e.model)
        logp[i, :k] = torch.tensor(e.logp)
        ent[i, :k] = torch.tensor(e.entropy)
        turn_ids[i, :k] = torch.tensor(e.turn, dtype=torch.long)
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=ids,
        response_mask=mask,
        logp=logp,
        entropies=ent,
        truncated=torch.tensor([e.truncated for e in episodes], dtype=torch.bool),
        generated_tokens=generated,
        structure={
            "turn_ids": turn_ids,
            "environment_reward": torch.tensor([e.reward for e in episodes], dtype=torch.float64),
        },
        has_entropies=has_entropies,
    )


def _check(
    engine: RolloutEngine, params: SamplingParams, max_turns: int, max_turn_tokens: int | None
) -> Any:
    if max_turns < 1:
        raise ValueError(f"rollout strategy 'multi_turn': max_turns must be >= 1, got {max_turns}")
    if max_turn_tokens is not None and max_turn_tokens < 1:
        raise ValueError(
            f"rollout strategy 'multi_turn': max_turn_tokens must be >= 1, got {max_turn_tokens}"
        )
    if params.with_hidden:
        raise ValueError(
            "rollout strategy 'multi_turn' records no hidden states (the environment's tokens "
            "have none), which a shaper of this run reads (reward shaper 'gar'): use the "
            "'parallel' strategy with it"
        )
    if engine.tokenizer is None:
        raise ValueError(
            f"rollout strategy 'multi_turn' needs an engine with a tokenizer (the model's "
            f"turns are read as text); {type(engine).__name__} has none"
        )
    return engine.tokenizer


@lru_cache(maxsize=8)
def _environment(name: str, options: str) -> Environment:
    """One environment per (name, options) for the run: built once, reused every step."""
    return get_environment(name, **json.loads(options))


def environment_of(name: str, options: Mapping[str, Any] | None) -> Environment:
    return _environment(name, json.dumps(dict(options or {}), sort_keys=True))


@ROLLOUT_STRATEGIES.register("multi_turn")
@produces("turn_ids", "environment_reward")
def multi_turn(
    engine: RolloutEngine,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    group_size: int,
    score: ScoreFn | None = None,
    on_finished: FinishedFn | None = None,
    rows: Sequence[Mapping[str, Any]] | None = None,
    environment: EnvironmentName,
    environment_options: Mapping[str, Any] | None = None,
    max_turns: int = 4,
    max_turn_tokens: int | None = None,
    chat_template: bool = False,
) -> tuple[Rollouts, torch.Tensor]:
    """G episodes per prompt with the registered `environment` (built with
    `environment_options`), each started from its prompt's data row in `rows`, up to
    `max_turns` model turns of up to `max_turn_tokens` tokens each (None: the episode's room)
    within `rollout.max_new_tokens` tokens per episode; replies through the chat template
    when `chat_template` (set it as `model.chat_template`)."""
    if rows is not None and len(rows) != len(prompts):
        raise ValueError(
            f"rollout strategy 'multi_turn': {len(prompts)} prompts but {len(rows)} rows"
        )
    rollouts, _ = run_episodes(
        engine,
        environment_of(environment, environment_options),
        [p for p in prompts for _ in range(group_size)],
        params,
        max_turns=max_turns,
        max_turn_tokens=max_turn_tokens,
        chat_template=chat_template,
        on_finished=None
        if on_finished is None
        else lambda i, ids: on_finished(i // group_size, ids),
        rows=None if rows is None else [r for r in rows for _ in range(group_size)],
    )
    return rollouts, torch.arange(len(prompts)).repeat_interleave(group_size)


def held_out_rollouts(
    engine: RolloutEngine,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    rows: Sequence[Mapping[str, Any]] | None = None,
    environment: EnvironmentName,
    environment_options: Mapping[str, Any] | None = None,
    max_turns: int = 4,
    max_turn_tokens: int | None = None,
    chat_template: bool = False,
) -> Rollouts:
    """One episode per prompt, started from the data row of the same index in `rows`, for
    held-out evaluation (greedy or sampled as `params` say)."""
    rollouts, _ = run_episodes(
        engine,
        environment_of(environment, environment_options),
        prompts,
        params,
        max_turns=max_turns,
        max_turn_tokens=max_turn_tokens,
        chat_template=chat_template,
        rows=rows,
    )
    return rollouts


# Held-out evaluation plays episodes too (`policyopt.train.held_out`), with the run's options.
multi_turn.held_out = held_out_rollouts  # type: ignore[attr-defined]


@ROLLOUT_ANNOTATORS.register("turn_segments")
@needs("turn_ids")
@produces("segment_ids")
def turn_segments(rollouts: Rollouts) -> dict[str, torch.Tensor]:
    """HISPO's segments as the model's turns: segment k - 1 is turn k (the replies between
    turns are masked out anyway), so that the `hispo` loss takes one importance ratio per
    turn. Needs the `multi_turn` strategy's `turn_ids`: a config without it is refused at
    load, naming the strategy that produces them."""
    turns = rollouts.structure.get("turn_ids")
    if turns is None:
        raise ValueError(
            "rollout annotator 'turn_segments' needs 'turn_ids', which rollout strategy "
            "'multi_turn' produces"
        )
    return {"segment_ids": (turns - 1).clamp(min=0)}
