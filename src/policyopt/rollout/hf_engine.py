"""Batched sampling with the model's KV cache, on any Hugging Face causal LM.

One forward per new token for the whole batch; rows that reached EOS keep feeding padding
(masked out) until every row is done or `max_new_tokens` is reached.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from policyopt.rollout.base import ENGINES, RolloutEngine, Rollouts, SamplingParams, concat_rollouts
from policyopt.rollout.sampling import sample_next


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (ids [B, P], mask [B, P])."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        if p:
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding: 0 at each row's first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _cache_argument(model: PreTrainedModel) -> str:
    """transformers 5.2x names the KV cache `cache`; earlier releases `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out: object) -> object:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values  # type: ignore[attr-defined]


@ENGINES.register("hf")
class HFEngine(RolloutEngine):
    """Sampling loop over `model.forward` with `past_key_values`."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 256,
        generator: torch.Generator | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer  # strategies that read text (DATPO's sentence forks)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.batch_size = batch_size
        self.generator = generator
        self._cache_kw = _cache_argument(model)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollouts:
        if not prompts:
            raise ValueError("generate() got no prompts")
        parts = [
            self._generate_batch(prompts[i : i + self.batch_size], params)
            for i in range(0, len(prompts), self.batch_size)
        ]
        return concat_rollouts(parts, self.pad_id)

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> Rollouts:
        was_training = self.model.training
        self.model.eval()
        try:
            return self._sample(prompts, params)
        finally:
            self.model.train(was_training)

    def _sample(self, prompts: list[list[int]], params: SamplingParams) -> Rollouts:
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        device = next(self.model.parameters()).device
        ids, mask = prompt_ids.to(device), prompt_mask.to(device)
        pos = positions(mask)
        with head_inputs(self.model, params.with_hidden) as hidden_steps:
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
            )
            budget = torch.full((len(prompts),), params.max_new_tokens)
            decoded = self.decode(
                _cache_of(out), out.logits[:, -1], mask, pos[:, -1:], budget, params
            )
        return to_rollouts(prompt_ids, prompt_mask, decoded, hidden_steps)

    def decode(
        self,
        cache: object,
        logits: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        budget: torch.Tensor,
        params: SamplingParams,
    ) -> Decoded:
        """Sample from `logits` [n, V] (the prefill's last position) on, one forward per token
        with the KV `cache`, until every row hit EOS or its token `budget` [n]. `mask` is the
        attention mask so far and `pos` [n, 1] each row's last position id."""
        device = logits.device
        budget = budget.to(device)
        alive = torch.ones(logits.shape[0], dtype=torch.bool, device=device)
        finished = torch.zeros_like(alive)
        tokens, logps, ents, alive_steps = [], [], [], []
        for step in range(int(budget.max())):
            alive = alive & (step < budget)
            tok, lp, ent = sample_next(
                logits,
                temperature=params.temperature,
                top_p=params.top_p,
                greedy=params.greedy,
                generator=self.generator,
            )
            tok = torch.where(alive, tok, torch.full_like(tok, self.pad_id))
            tokens.append(tok)
            logps.append(lp)
            ents.append(ent)
            alive_steps.append(alive)
            finished = finished | (alive & (tok == self.eos_id))
            alive = alive & (tok != self.eos_id)
            if not (alive & (step + 1 < budget)).any():
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = pos + 1
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                **{self._cache_kw: cache},
            )
            cache = _cache_of(out)
            logits = out.logits[:, -1]
        return Decoded(
            tokens=torch.stack(tokens, 1),
            logp=torch.stack(logps, 1),
            entropy=torch.stack(ents, 1),
            mask=torch.stack(alive_steps, 1).float(),
            finished=finished,
        )


@dataclass
class Decoded:
    """What `HFEngine.decode` sampled: [n, steps] tensors and `finished` [n] (ended by EOS)."""

    tokens: torch.Tensor
    logp: torch.Tensor
    entropy: torch.Tensor
    mask: torch.Tensor
    finished: torch.Tensor


@contextmanager
def head_inputs(model: PreTrainedModel, enabled: bool) -> Iterator[list[torch.Tensor]]:
    """Collect, at every forward, the last position's input of the LM head (the hidden state
    that produced the sampled token's logits; GAR reads it). Yields the list it fills."""
    steps: list[torch.Tensor] = []
    if not enabled:
        yield steps
        return
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: steps.append(args[0][:, -1].detach().float())
    )
    try:
        yield steps
    finally:
        hook.remove()


def to_rollouts(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    d: Decoded,
    hidden_steps: list[torch.Tensor],
) -> Rollouts:
    """Rollouts on the CPU from decoded tokens; padding zeroed in logp, entropy and hidden."""
    hidden = None
    if hidden_steps:
        hidden = (torch.stack(hidden_steps[: d.tokens.shape[1]], 1) * d.mask[..., None]).cpu()
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=d.tokens.cpu(),
        response_mask=d.mask.cpu(),
        logp=(d.logp * d.mask).cpu(),
        entropy=(d.entropy * d.mask).cpu(),
        truncated=(~d.finished).cpu(),
        generated_tokens=int(d.mask.sum().item()),
        hidden=hidden,
    )
