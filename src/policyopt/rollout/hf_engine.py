"""Batched sampling with the model's KV cache, on any Hugging Face causal LM.

One forward per new token for the whole batch; rows that reached EOS keep feeding padding
(masked out) until every row is done or `max_new_tokens` is reached.
"""

from __future__ import annotations

import inspect

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
        n = len(prompts)
        device = next(self.model.parameters()).device
        ids, mask = prompt_ids.to(device), prompt_mask.to(device)
        pos = positions(mask)
        hidden_steps: list[torch.Tensor] = []
        hook = None
        if params.with_hidden:
            head = self.model.get_output_embeddings()
            hook = head.register_forward_hook(
                lambda _m, args, _out: hidden_steps.append(args[0][:, -1].detach().float())
            )
        tokens, logps, ents, alive_steps = [], [], [], []
        alive = torch.ones(n, dtype=torch.bool, device=device)
        try:
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
            )
            for step in range(params.max_new_tokens):
                tok, lp, ent = sample_next(
                    out.logits[:, -1],
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
                alive = alive & (tok != self.eos_id)
                if not alive.any() or step == params.max_new_tokens - 1:
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                pos = pos[:, -1:] + 1
                out = self.model(
                    input_ids=tok[:, None],
                    attention_mask=mask,
                    position_ids=pos,
                    use_cache=True,
                    **{self._cache_kw: _cache_of(out)},
                )
        finally:
            if hook is not None:
                hook.remove()
        resp_mask = torch.stack(alive_steps, 1).float()
        hidden = None
        if params.with_hidden:
            hidden = torch.stack(hidden_steps[: len(tokens)], 1) * resp_mask[..., None]
        return Rollouts(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=torch.stack(tokens, 1).cpu(),
            response_mask=resp_mask.cpu(),
            logp=(torch.stack(logps, 1) * resp_mask).cpu(),
            entropy=(torch.stack(ents, 1) * resp_mask).cpu(),
            truncated=alive.cpu(),
            generated_tokens=int(resp_mask.sum().item()),
            hidden=None if hidden is None else hidden.cpu(),
        )
