"""Turning one step's logits into a token, its log-prob and the distribution's entropy."""

from __future__ import annotations

import torch


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    greedy: bool,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick a token per row of `logits` [B, V].

    Returns (token [B], logp [B], entropy [B]). The log-prob and entropy are those of the
    temperature-scaled distribution before top-p truncation: that is the distribution the
    trainer recomputes (verl's convention), so ratios at the first update are 1.
    Logits at -inf (constrained decoding: `rollout.grammar.mask_logits`) get probability 0,
    so the distribution, its log-probs and entropy are the constrained ones, the allowed
    tokens' relative probabilities unchanged; the trainer masks the same.
    """
    scaled = logits.float() / (1.0 if greedy else temperature)
    logp_all = torch.log_softmax(scaled, dim=-1)
    probs = logp_all.exp()
    # H = -sum_v p(v) log p(v); 0 * -inf would be nan, so zero those terms.
    entropy = -(probs * logp_all.nan_to_num(neginf=0.0)).sum(-1)
    if greedy:
        token = scaled.argmax(-1)
    else:
        token = torch.multinomial(_top_p(probs, top_p), 1, generator=generator).squeeze(-1)
    return token, logp_all.gather(-1, token[:, None]).squeeze(-1), entropy


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of tokens whose mass reaches top_p."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    # Drop a token when the mass strictly before it already reaches top_p.
    drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_p)
