"""`pl`: the rollout engine of a Plackett–Luce ranking policy (`models.ranker.PLRanker`).

Each prompt is a query's candidate item ids; a response is a ranking of its top
`max_new_tokens` positions (k), sampled exactly by the Gumbel-top-k trick from the scores at
the sampling temperature, or the k best-scored items when greedy. With `top_p` < 1 each
position is drawn from the nucleus of the remaining items (the fewest most probable whose
probabilities sum to >= top_p, renormalised), position by position, as an LM engine applies
top-p per token; as there, the recorded log-probs are those of the untruncated policy. A query with fewer than k
candidates is ranked in full (its response is shorter). Per position the engine records the
sampling log-prob and entropy, computed by the policy's own `response_logprobs` (the same
function the update uses, so the on-policy ratio is exactly 1), and the placed items as
indices into the candidates (`Rollouts.item_columns`). A ranking is never truncated.
"""

from __future__ import annotations

from typing import Any

import torch

from policyopt.core.plackett_luce import sample_rankings
from policyopt.models.item_tokenizer import PAD_ID
from policyopt.rollout.base import ENGINES, FinishedFn, RolloutEngine, Rollouts, SamplingParams


class PLEngine(RolloutEngine):
    def __init__(self, model: Any, tokenizer: Any = None, *, batch_size: int = 256) -> None:
        if not hasattr(model, "scores"):
            raise ValueError(
                f"rollout engine 'pl' samples rankings from a ranking policy (model "
                f"'pl-mlp' or 'pl-linear'); got a {type(model).__name__}"
            )
        self.model = model
        self.batch_size = batch_size

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        on_finished: FinishedFn | None = None,
    ) -> Rollouts:
        parts = [
            self._generate(prompts[i : i + self.batch_size], params)
            for i in range(0, len(prompts), self.batch_size)
        ]
        if len(parts) == 1:
            return parts[0]
        from policyopt.rollout.base import concat_rollouts

        return concat_rollouts(parts, PAD_ID)

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollouts:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("a ranking prompt has no candidate items")
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding, as for language models
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        was_training = self.model.training
        self.model.eval()
        scores = self.model.scores(ids, mask)
        k = min(params.max_new_tokens, width)
        if params.greedy:
            local = scores.topk(k, dim=1).indices
        elif params.top_p < 1.0:
            local = nucleus_rankings(scores / params.temperature, k, params.top_p)
        else:
            local = sample_rankings(scores / params.temperature, 1, k)[:, 0]
        counts = mask.sum(1, keepdim=True)
        response_mask = torch.arange(k)[None, :] < counts
        response = ids.gather(1, local).masked_fill(~response_mask, PAD_ID)
        columns = (local - (width - counts)).masked_fill_(~response_mask, -1)  # unpadded
        out = self.model.response_logprobs(
            torch.cat([ids, response], 1),
            torch.cat([mask, response_mask.long()], 1),
            k,
            temperature=1.0 if params.greedy else params.temperature,
            with_entropy=True,
        )
        self.model.train(was_training)
        return Rollouts(
            prompt_ids=ids,
            prompt_mask=mask,
            response_ids=response,
            response_mask=response_mask.float(),
            logp=out.logp.float(),
            entropies=out.entropies.float(),
            truncated=torch.zeros(len(prompts), dtype=torch.bool),
            generated_tokens=int(response_mask.sum()),
            item_columns=columns,
        )


def nucleus_rankings(
    scores: torch.Tensor, k: int, top_p: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Top-k lists [B, k], each position drawn from the top-p nucleus of the softmax over
    the items not yet placed (the most probable item is always kept)."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    z = scores.detach().double().clone()
    out = torch.empty(z.shape[0], k, dtype=torch.long)
    for t in range(k):
        probs = torch.softmax(z, dim=1)
        sorted_p, order = probs.sort(dim=1, descending=True)
        before = sorted_p.cumsum(1) - sorted_p  # mass strictly above each item
        keep = before < top_p
        keep[:, 0] = True
        sorted_p = sorted_p * keep
        pick = torch.multinomial(sorted_p / sorted_p.sum(1, keepdim=True), 1, generator=generator)
        out[:, t] = order.gather(1, pick).squeeze(1)
        z.scatter_(1, out[:, t : t + 1], float("-inf"))
    return out


@ENGINES.register("pl")
def pl_engine(model: Any, tokenizer: Any = None, *, batch_size: int = 256) -> PLEngine:
    return PLEngine(model, tokenizer, batch_size=batch_size)
