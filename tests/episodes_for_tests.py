"""A scripted engine and a scripted environment for the multi-turn tests."""

from __future__ import annotations

import torch

from policyopt.rollout.base import RolloutEngine, Rollouts, SamplingParams
from policyopt.rollout.environment import Environment, Episode, Reply


def logp_of(position: int) -> float:
    """The scripted engine's log-prob of the token it writes at turn position `position`."""
    return -0.1 * (position + 1)


class ScriptedEngine(RolloutEngine):
    """Writes turn k of every live episode from `turns[k]` (one text per episode, in the order
    of the prompts of the first call), up to `max_new_tokens`; log-prob `logp_of(t)` and
    entropy 1 at position t of a turn. A text ending with the EOS text ends with EOS."""

    def __init__(self, tokenizer, turns: list[list[str]]) -> None:  # noqa: ANN001
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.turns = turns
        self.calls: list[list[list[int]]] = []  # the contexts of each call

    def generate(self, prompts, params: SamplingParams, on_finished=None) -> Rollouts:  # noqa: ANN001
        turn = len(self.calls)
        if turn == 0:
            self.sofar = [list(p) for p in prompts]
            rows = list(range(len(prompts)))
        else:  # the live episodes, in order: each context extends its episode's last one
            rows, after = [], -1
            for p in prompts:
                after = next(
                    i
                    for i in range(after + 1, len(self.sofar))
                    if list(p[: len(self.sofar[i])]) == self.sofar[i]
                )
                rows.append(after)
        self.calls.append([list(p) for p in prompts])
        samples = [
            self.tokenizer(self.turns[turn][i], add_special_tokens=False)["input_ids"] for i in rows
        ]
        width = max(min(len(s), params.max_new_tokens) for s in samples)
        n = len(prompts)
        out_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(n, width)
        logp = torch.zeros(n, width)
        truncated = torch.zeros(n, dtype=torch.bool)
        for r, (i, s) in enumerate(zip(rows, samples, strict=True)):
            k = min(len(s), params.max_new_tokens)
            out_ids[r, :k] = torch.tensor(s[:k])
            mask[r, :k] = 1.0
            logp[r, :k] = torch.tensor([logp_of(t) for t in range(k)])
            truncated[r] = s[k - 1] != self.tokenizer.eos_token_id
            self.sofar[i] = list(prompts[r]) + s[:k]
        p_ids = torch.zeros(n, 1, dtype=torch.long)
        return Rollouts(
            prompt_ids=p_ids,
            prompt_mask=torch.ones_like(p_ids),
            response_ids=out_ids,
            response_mask=mask,
            logp=logp,
            entropies=mask.clone(),
            truncated=truncated,
            generated_tokens=int(mask.sum()),
        )


class Scripted(Environment):
    """Replies `replies[k]` (text) to turn k+1 of every episode; after the last one the
    episode ends. Records the turns it saw."""

    def __init__(self, replies: list[str], tools: tuple = ()) -> None:  # noqa: ANN001
        self.replies = replies
        self.tools = tools
        self.seen: list[list[str]] = []

    def start(self, prompt: str, row) -> Episode:  # noqa: ANN001
        seen: list[str] = []
        self.seen.append(seen)
        replies = self.replies

        class _Episode(Episode):
            def step(self, turn: str) -> Reply:
                seen.append(turn)
                k = len(seen) - 1
                if k >= len(replies):
                    return Reply(done=True)
                return Reply(messages=({"role": "tool", "content": replies[k]},))

        return _Episode()
