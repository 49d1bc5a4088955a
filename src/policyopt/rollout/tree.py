"""Branches from shared prefixes with KV-cache reuse (DATPO's tree rollouts).

`sample_branches(engine, prefixes, budgets, branches, params)` continues each prefix
(prompt + the part of a response before a fork) `branches[j]` times. The prefix is run through
the model once, in one batched prefill over all prefixes; its KV cache and last-position
logits are then repeated along the batch dimension, one copy per branch, and the branches are
sampled from there token by token, exactly as `HFEngine` samples (same `sample_next`, same
padding rules). No branch recomputes its prefix, and no prefix token is counted as generated:
`generated_tokens` counts the continuation tokens only.

The base rollout that a prefix comes from had that prefix in its own KV cache while it was
sampled; we do not keep those caches (they would have to live through scoring), so the one
prefill per fork point is the only prefix compute a tree adds.

Continuation j may hold at most `budgets[j]` tokens (so that prefix + continuation stays within
the response limit); a continuation that reaches its budget without EOS is truncated.
"""

from __future__ import annotations

import torch

from policyopt.rollout.base import Rollouts, SamplingParams, concat_rollouts
from policyopt.rollout.hf_engine import HFEngine, _cache_of, left_pad, positions
from policyopt.rollout.sampling import sample_next


@torch.no_grad()
def sample_branches(
    engine: HFEngine,
    prefixes: list[list[int]],
    budgets: list[int],
    branches: list[int],
    params: SamplingParams,
) -> Rollouts:
    """`branches[j]` continuations of `prefixes[j]`, rows ordered prefix by prefix.

    Returns Rollouts whose `prompt_ids` are the prefixes (left-padded) and whose responses are
    the continuations (at most `budgets[j]` tokens each). Prefixes with 0 branches give no row.
    """
    if not (len(prefixes) == len(budgets) == len(branches)):
        raise ValueError("sample_branches: prefixes, budgets and branches differ in length")
    if any(b < 1 for b in budgets) or any(c < 0 for c in branches):
        raise ValueError("sample_branches: budgets must be >= 1 and branches >= 0")
    if not isinstance(engine, HFEngine):
        raise TypeError(f"tree rollouts need the 'hf' engine (KV-cache reuse), got {engine!r}")
    jobs = [j for j, c in enumerate(branches) if c > 0]
    if not jobs:
        raise ValueError("sample_branches: no branches to sample")
    parts, chunk, rows = [], [], 0
    for j in jobs:  # pack prefixes while their branches fit in one engine batch
        if chunk and rows + branches[j] > engine.batch_size:
            parts.append(_chunk(engine, prefixes, budgets, branches, chunk, params))
            chunk, rows = [], 0
        chunk.append(j)
        rows += branches[j]
    parts.append(_chunk(engine, prefixes, budgets, branches, chunk, params))
    return concat_rollouts(parts, engine.pad_id)


def _chunk(
    engine: HFEngine,
    prefixes: list[list[int]],
    budgets: list[int],
    branches: list[int],
    chunk: list[int],
    params: SamplingParams,
) -> Rollouts:
    was_training = engine.model.training
    engine.model.eval()
    try:
        return _sample(
            engine,
            [prefixes[j] for j in chunk],
            torch.tensor([budgets[j] for j in chunk]),
            torch.tensor([branches[j] for j in chunk]),
            params,
        )
    finally:
        engine.model.train(was_training)


def _sample(
    engine: HFEngine,
    prefixes: list[list[int]],
    budget: torch.Tensor,
    repeats: torch.Tensor,
    params: SamplingParams,
) -> Rollouts:
    model = engine.model
    device = next(model.parameters()).device
    prefix_ids, prefix_mask = left_pad(prefixes, engine.pad_id)
    ids, mask = prefix_ids.to(device), prefix_mask.to(device)
    pos = positions(mask)
    # Row r of the branch batch is a copy of prefix `copy[r]`.
    copy = torch.repeat_interleave(torch.arange(len(prefixes)), repeats)
    on_device = copy.to(device)
    hidden_steps: list[torch.Tensor] = []
    hook = None
    if params.with_hidden:
        head = model.get_output_embeddings()
        hook = head.register_forward_hook(
            lambda _m, args, _out: hidden_steps.append(args[0][:, -1].detach().float())
        )
    try:
        # One prefill per prefix; then its cache, mask, position and logits serve every branch.
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        cache = _cache_of(out)
        cache.batch_select_indices(on_device)  # type: ignore[attr-defined]
        if hidden_steps:
            hidden_steps[0] = hidden_steps[0][on_device]
        tok, logp, ent, resp_mask, finished = _decode(
            engine,
            cache,
            out.logits[:, -1][on_device],
            mask[on_device],
            pos[on_device, -1:],
            budget[copy],
            params,
        )
    finally:
        if hook is not None:
            hook.remove()
    hidden = None
    if params.with_hidden:
        hidden = torch.stack(hidden_steps[: tok.shape[1]], 1) * resp_mask[..., None]
    return Rollouts(
        prompt_ids=prefix_ids[copy],
        prompt_mask=prefix_mask[copy],
        response_ids=tok.cpu(),
        response_mask=resp_mask.cpu(),
        logp=(logp * resp_mask).cpu(),
        entropy=(ent * resp_mask).cpu(),
        truncated=(~finished).cpu(),
        generated_tokens=int(resp_mask.sum().item()),
        hidden=None if hidden is None else hidden.cpu(),
    )


def _decode(
    engine: HFEngine,
    cache: object,
    logits: torch.Tensor,
    mask: torch.Tensor,
    pos: torch.Tensor,
    budget: torch.Tensor,
    params: SamplingParams,
) -> tuple[torch.Tensor, ...]:
    """Sample until every row hit EOS or its budget: the loop of `HFEngine._sample` with a
    per-row token budget. Returns tokens, logp, entropy, mask (each [n, steps]) and a bool [n]
    that is True where the row ended with EOS."""
    device = logits.device
    budget = budget.to(device)
    n = logits.shape[0]
    alive = torch.ones(n, dtype=torch.bool, device=device)
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    tokens, logps, ents, alive_steps = [], [], [], []
    for step in range(int(budget.max())):
        alive = alive & (step < budget)
        tok, lp, ent = sample_next(
            logits,
            temperature=params.temperature,
            top_p=params.top_p,
            greedy=params.greedy,
            generator=engine.generator,
        )
        tok = torch.where(alive, tok, torch.full_like(tok, engine.pad_id))
        tokens.append(tok)
        logps.append(lp)
        ents.append(ent)
        alive_steps.append(alive)
        finished = finished | (alive & (tok == engine.eos_id))
        alive = alive & (tok != engine.eos_id)
        if not (alive & (step + 1 < budget)).any():
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        pos = pos + 1
        out = engine.model(
            input_ids=tok[:, None],
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            **{engine._cache_kw: cache},
        )
        cache = _cache_of(out)
        logits = out.logits[:, -1]
    resp_mask = torch.stack(alive_steps, 1).float()
    return (
        torch.stack(tokens, 1),
        torch.stack(logps, 1),
        torch.stack(ents, 1),
        resp_mask,
        finished,
    )
