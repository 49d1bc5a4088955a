"""Branches from shared prefixes with KV-cache reuse (DATPO's tree rollouts).

Two ways in. `branches_from_cache(engine, kept, rows, at, budgets, branches, params)`
continues base rollout `rows[j]` from response position `at[j]` out of the KV cache its own
sampling left behind (`HFEngine.generate_with_cache`): the prefix costs no model compute at
all, only one single-token forward per fork (the last prefix token, whose logits the base's
sampling did not keep). `sample_branches` starts from token lists instead, for bases whose
cache is gone: one batched prefill of the prefixes. Both then sample every branch with
`HFEngine.decode`, and give the same branches (the same tokens under greedy decoding).

`sample_branches(engine, prefixes, budgets, branches, params)` continues each prefix
(prompt + the part of a response before a fork) `branches[j]` times. The prefix is run through
the model once, in one batched prefill over all prefixes; its KV cache and last-position
logits are then repeated along the batch dimension, one copy per branch, and the branches are
sampled from there token by token by `HFEngine.decode`, the loop plain sampling uses. No
branch recomputes its prefix, and no prefix token is counted as generated: `generated_tokens`
counts the continuation tokens only.

(With `sample_branches`, the one prefill per fork point is the prefix compute a tree adds;
`branches_from_cache` avoids it by keeping the bases' caches through scoring.)

Continuation j may hold at most `budgets[j]` tokens (so that prefix + continuation stays within
the response limit); a continuation that reaches its budget without EOS is truncated.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from policyopt.rollout.base import Rollouts, SamplingParams, concat_rollouts
from policyopt.rollout.hf_engine import (
    HFEngine,
    KeptCache,
    PreallocatedLayer,
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


@torch.no_grad()
def branches_from_cache(
    engine: HFEngine,
    kept: KeptCache,
    base: Rollouts,
    rows: list[int],
    at: list[int],
    budgets: list[int],
    branches: list[int],
    params: SamplingParams,
) -> Rollouts:
    """`branches[j]` continuations of base row `rows[j]` after its first `at[j]` response
    tokens, from the KV cache `kept` of the `generate_with_cache` call that sampled `base`;
    rows ordered fork by fork, as `sample_branches` orders them (its `prefixes[j]` being the
    prompt + those tokens). Continuation j holds at most `budgets[j]` tokens."""
    if not (len(rows) == len(at) == len(budgets) == len(branches)):
        raise ValueError("branches_from_cache: rows, at, budgets and branches differ in length")
    if any(b < 1 for b in budgets) or any(c < 0 for c in branches):
        raise ValueError("branches_from_cache: budgets must be >= 1 and branches >= 0")
    for r, t in zip(rows, at, strict=True):
        if not 1 <= t < int(base.lengths[r]):
            raise ValueError(
                f"branches_from_cache: a fork of row {r} at {t} is outside 1..{int(base.lengths[r]) - 1}"
            )
    jobs = [j for j, c in enumerate(branches) if c > 0]
    if not jobs:
        raise ValueError("branches_from_cache: no branches to sample")
    parts, chunk, count = [], [], 0
    for j in jobs:  # pack forks while their branches fit in one engine batch
        if chunk and count + branches[j] > engine.batch_size:
            parts.append(
                _from_cache(engine, kept, base, rows, at, budgets, branches, chunk, params)
            )
            chunk, count = [], 0
        chunk.append(j)
        count += branches[j]
    parts.append(_from_cache(engine, kept, base, rows, at, budgets, branches, chunk, params))
    return concat_rollouts(parts, engine.pad_id)


def _from_cache(
    engine: HFEngine,
    kept: KeptCache,
    base: Rollouts,
    rows: list[int],
    at: list[int],
    budgets: list[int],
    branches: list[int],
    chunk: list[int],
    params: SamplingParams,
) -> Rollouts:
    model = engine.model
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        # Fork j keeps response tokens [0, t): the cache holds prompt + tokens [0, t - 1),
        # token t - 1 is fed once to get the logits of position t.
        cached = _gather_prefix_cache(kept, [rows[j] for j in chunk], [at[j] for j in chunk])
        cache, mask = cached[0], cached[1].to(device)
        last = torch.tensor([[int(base.response_ids[rows[j], at[j] - 1])] for j in chunk])
        real = mask.sum(1, keepdim=True)  # cached real tokens = position id of the fed token
        mask = torch.cat([mask, mask.new_ones(len(chunk), 1)], dim=1)
        copy = torch.repeat_interleave(
            torch.arange(len(chunk)), torch.tensor([branches[j] for j in chunk])
        )
        on_device = copy.to(device)
        with head_inputs(model, params.with_hidden) as hidden_steps:
            out = model(
                input_ids=last.to(device),
                attention_mask=mask,
                position_ids=real,
                use_cache=True,
                logits_to_keep=1,
                **{engine._cache_kw: cache},
            )
            cache = _cache_of(out)
            cache.batch_select_indices(on_device)  # type: ignore[attr-defined]
            if hidden_steps:
                hidden_steps[0] = hidden_steps[0][on_device]
            decoded = engine.decode(
                cache,
                out.logits[:, -1][on_device],
                mask[on_device],
                real[on_device],
                torch.tensor([budgets[j] for j in chunk])[copy],
                params,
            )
    finally:
        model.train(was_training)
    prefix_ids, prefix_mask = left_pad(
        [
            base.prompt_ids[rows[j]][base.prompt_mask[rows[j]] > 0].tolist()
            + base.response_ids[rows[j], : at[j]].tolist()
            for j in chunk
        ],
        engine.pad_id,
    )
    return to_rollouts(prefix_ids[copy], prefix_mask[copy], decoded, hidden_steps)


def _gather_prefix_cache(
    kept: KeptCache, rows: list[int], at: list[int]
) -> tuple[DynamicCache, torch.Tensor]:
    """A new cache (and attention mask [J, W]) holding, for fork j, the cached prompt and first
    at[j] − 1 response tokens of base row rows[j], right-aligned (left padding) in W columns."""
    sources = []
    for r, t in zip(rows, at, strict=True):
        cache, local, width = kept.locate(r)
        plen = kept.prompt_lengths[r]
        sources.append((cache, local, width - plen, width + t - 1))  # columns [start, end)
    width = max(end - start for _, _, start, end in sources)
    first = sources[0][0]
    layers = getattr(first, "layers", None)
    if not layers or any(type(layer) not in (DynamicLayer, PreallocatedLayer) for layer in layers):
        # Sliding-window or linear-attention layers do not keep every position.
        raise TypeError(
            "branches_from_cache needs a cache of full-attention layers (DynamicLayer); "
            "for this model use datpo_tree's reuse_kv_cache=false"
        )
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=layers[0].keys.device)
    out = DynamicCache()
    for index in range(len(layers)):
        keys = values = None
        for j, (cache, local, start, end) in enumerate(sources):
            layer = cache.layers[index]  # type: ignore[attr-defined]
            k = layer.keys[local, :, start:end]
            v = layer.values[local, :, start:end]
            if keys is None:
                keys = k.new_zeros((len(rows), k.shape[0], width, k.shape[-1]))
                values = v.new_zeros((len(rows), v.shape[0], width, v.shape[-1]))
            keys[j, :, width - (end - start) :] = k
            values[j, :, width - (end - start) :] = v
            if index == 0:
                mask[j, width - (end - start) :] = 1
        out.update(keys, values, index)
    return out, mask
