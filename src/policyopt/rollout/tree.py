"""Branches from shared prefixes with KV-cache reuse (DATPO's tree rollouts).

One branch sampler (`_branches`), two ways in. `branches_from_cache(engine, kept, rows, at, budgets, branches, params)`
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

An engine without the hf engine's internals that can continue prefixes itself
(`RolloutEngine.prefix_continuations`: the vllm engine, whose continuation requests find the
prefix's KV in vLLM's prefix cache) gets `sample_branches`' job handed to its
`continue_prefixes`, under the same contract.

Continuation j may hold at most `budgets[j]` tokens (so that prefix + continuation stays within
the response limit); a continuation that reaches its budget without EOS is truncated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from policyopt.rollout.base import RolloutEngine, Rollouts, SamplingParams, concat_rollouts
from policyopt.rollout.hf_engine import (  # the tree is built on the hf engine's internals
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
    engine: RolloutEngine,
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
    if not engine.tree_rollouts and engine.prefix_continuations:
        if not any(branches):
            raise ValueError("sample_branches: no branches to sample")
        return engine.continue_prefixes(prefixes, budgets, branches, params)
    _check_engine(engine)
    hf = cast(HFEngine, engine)  # tree_rollouts: the hf engine's model, decode and batch

    def prefill(chunk: list[int]) -> Rollouts:
        """One prefill of the chunk's prefixes; its cache serves every branch."""
        device = next(hf.model.parameters()).device
        prefix_ids, prefix_mask = left_pad([prefixes[j] for j in chunk], hf.pad_id)
        mask = prefix_mask.to(device)
        pos = positions(mask)
        inputs = {"input_ids": prefix_ids.to(device), "attention_mask": mask, "position_ids": pos}
        return _branches(
            hf,
            inputs,
            mask,
            pos[:, -1:],
            chunk,
            budgets,
            branches,
            params,
            prefix_ids,
            prefix_mask,
        )

    return _packed(hf, branches, prefill, "sample_branches")


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
    _check_engine(engine)

    def from_cache(chunk: list[int]) -> Rollouts:
        """Fork j keeps response tokens [0, t): the cache holds prompt + tokens [0, t - 1);
        token t - 1 is fed once to get the logits of position t."""
        device = next(engine.model.parameters()).device
        cache, mask = _gather_prefix_cache(kept, [rows[j] for j in chunk], [at[j] for j in chunk])
        mask = mask.to(device)
        last = torch.tensor([[int(base.response_ids[rows[j], at[j] - 1])] for j in chunk])
        real = mask.sum(1, keepdim=True)  # cached real tokens = position id of the fed token
        mask = torch.cat([mask, mask.new_ones(len(chunk), 1)], dim=1)
        inputs = {
            "input_ids": last.to(device),
            "attention_mask": mask,
            "position_ids": real,
            engine.cache_keyword: cache,
        }
        prefix_ids, prefix_mask = left_pad(
            [
                base.prompt_ids[rows[j]][base.prompt_mask[rows[j]] > 0].tolist()
                + base.response_ids[rows[j], : at[j]].tolist()
                for j in chunk
            ],
            engine.pad_id,
        )
        return _branches(
            engine, inputs, mask, real, chunk, budgets, branches, params, prefix_ids, prefix_mask
        )

    return _packed(engine, branches, from_cache, "branches_from_cache")


def _check_engine(engine: RolloutEngine) -> None:
    if not engine.tree_rollouts:
        raise TypeError(
            "tree rollouts need an engine with tree_rollouts (the 'hf' engine) or "
            f"prefix_continuations (the 'vllm' engine), got {engine!r}"
        )


def _packed(
    engine: HFEngine, branches: list[int], run: Callable[[list[int]], Rollouts], who: str
) -> Rollouts:
    """`run` on chunks of the jobs (entries with branches), packed while their branches fit
    in one engine batch; the chunks' rollouts stacked."""
    jobs = [j for j, c in enumerate(branches) if c > 0]
    if not jobs:
        raise ValueError(f"{who}: no branches to sample")
    parts, chunk, rows = [], [], 0
    for j in jobs:
        if chunk and rows + branches[j] > engine.batch_size:
            parts.append(run(chunk))
            chunk, rows = [], 0
        chunk.append(j)
        rows += branches[j]
    parts.append(run(chunk))
    return concat_rollouts(parts, engine.pad_id)


def _branches(
    engine: HFEngine,
    inputs: dict[str, Any],
    mask: torch.Tensor,
    last_position: torch.Tensor,
    chunk: list[int],
    budgets: list[int],
    branches: list[int],
    params: SamplingParams,
    prefix_ids: torch.Tensor,
    prefix_mask: torch.Tensor,
) -> Rollouts:
    """The one branch sampler: `model(**inputs)` (a prefill, or one token on a kept cache),
    its cache, mask, position and last logits repeated once per branch, every branch then
    sampled by `HFEngine.decode`."""
    model = engine.model
    device = next(model.parameters()).device
    # Row r of the branch batch is a copy of entry `copy[r]` of the chunk.
    copy = torch.repeat_interleave(
        torch.arange(len(chunk)), torch.tensor([branches[j] for j in chunk])
    )
    on_device = copy.to(device)
    was_training = model.training
    model.eval()
    try:
        with head_inputs(model, params.with_hidden) as hidden_steps:
            out = model(**inputs, use_cache=True, logits_to_keep=1)
            cache = _cache_of(out)
            cache.batch_select_indices(on_device)  # type: ignore[attr-defined]
            if hidden_steps:
                hidden_steps[0] = hidden_steps[0][on_device]
            decoded = engine.decode(
                cache,
                out.logits[:, -1][on_device],
                mask[on_device],
                last_position[on_device],
                torch.tensor([budgets[j] for j in chunk])[copy],
                params,
            )
    finally:
        model.train(was_training)
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
