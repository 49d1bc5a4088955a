"""Branches from shared prefixes with KV-cache reuse (DATPO's tree rollouts).

`sample_branches(engine, prefixes, budgets, branches, params)` continues each prefix
(prompt + the part of a response before a fork) `branches[j]` times. The prefix is run through
the model once, in one batched prefill over all prefixes; its KV cache and last-position
logits are then repeated along the batch dimension, one copy per branch, and the branches are
sampled from there token by token by `HFEngine.decode`, the loop plain sampling uses. No
branch recomputes its prefix, and no prefix token is counted as generated: `generated_tokens`
counts the continuation tokens only.

The base rollout that a prefix comes from had that prefix in its own KV cache while it was
sampled; we do not keep those caches (they would have to live through scoring), so the one
prefill per fork point is the only prefix compute a tree adds.

Continuation j may hold at most `budgets[j]` tokens (so that prefix + continuation stays within
the response limit); a continuation that reaches its budget without EOS is truncated.
"""

from __future__ import annotations

import torch

from policyopt.rollout.base import Rollouts, SamplingParams, concat_rollouts
from policyopt.rollout.hf_engine import (
    HFEngine,
    _cache_of,
    head_inputs,
    left_pad,
    positions,
    to_rollouts,
)


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
    with head_inputs(model, params.with_hidden) as hidden_steps:
        # One prefill per prefix; then its cache, mask, position and logits serve every branch.
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        cache = _cache_of(out)
        cache.batch_select_indices(on_device)  # type: ignore[attr-defined]
        if hidden_steps:
            hidden_steps[0] = hidden_steps[0][on_device]
        decoded = engine.decode(
            cache,
            out.logits[:, -1][on_device],
            mask[on_device],
            pos[on_device, -1:],
            budget[copy],
            params,
        )
    return to_rollouts(prefix_ids[copy], prefix_mask[copy], decoded, hidden_steps)
