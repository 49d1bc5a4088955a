"""DATPO's tree rollouts (SPEC §4.1-4.3), registered as the `datpo_tree` rollout strategy.

Per prompt: `n_base` base rollouts are sampled and scored; V(root) = their mean reward sets
the budget (K̂, B̂) = `adaptive_budget(V(root), k_max, b_max)`; each base rollout forks at the
starts of its K̂ highest-entropy sentences (`forks.py`), with B̂ branches per fork. A branch
is the prompt + the base's tokens before the fork, continued by sampling from the KV cache
the base's own sampling filled (`HFEngine.generate_with_cache`,
`policyopt.rollout.tree.branches_from_cache`): the prefix is not run through the model again
(one single-token forward per fork), nor counted as generated. The bases' caches are kept
until the branches are sampled (through scoring). `reuse_kv_cache=False` drops them after
sampling and prefills each fork's prefix once instead (`sample_branches`): less memory, more
compute, the same branches. A leaf's response holds the whole path, prefix included, with
the prefix's sampling log-probs and entropies copied from its base.

On the vllm engine (no KV cache of its own samples, `prefix_continuations`) a fork's
branches are continuation requests whose prompt is the prompt + the base's tokens before the
fork (`VLLMEngine.continue_prefixes`): vLLM's prefix cache still holds the base's KV blocks,
so the prefix is found there rather than recomputed (all but its last, partial block), and
only the continuation tokens count as generated. `reuse_kv_cache=True` needs that cache on
(`prefix_cache`: the engine enables it unless `enable_prefix_caching=false` is among its
options); False accepts an engine without it. The forks are chosen from the rollout-time
entropies, which the vllm engine computes with `entropies=trainer` only: without them the
strategy refuses (`MissingEntropyError`) rather than fork on zeros.

Returned: every leaf (base rollouts first, then branches) with its prompt index, and in
`structure["block_ids"]` [N, R] the id of the block each response token belongs to (blocks are
cut at the forks; a branch's prefix tokens carry its base's ids), which is all the `datpo`
advantage needs. A prompt's group therefore has between n_base and n_base (1 + k_max b_max)
leaves, depending on its difficulty and on how many sentences its rollouts have: the
trainer's `rollout.group_size` plays no part (the tree's size is set by n_base, k_max,
b_max), and every response, branch or base, stays within `rollout.max_new_tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from policyopt.core.structure import produces
from policyopt.methods.datpo.budget import adaptive_budget
from policyopt.methods.datpo.forks import candidate_scores, choose_forks, token_pieces
from policyopt.rollout.base import (
    FinishedFn,
    RolloutEngine,
    Rollouts,
    SamplingParams,
    concat_rollouts,
    require_entropies,
)
from policyopt.rollout.strategies import ROLLOUT_STRATEGIES, ScoreFn
from policyopt.rollout.tree import branches_from_cache, sample_branches

N_BASE = 4  # SPEC §4.1 (paper: N = 4)
K_MAX = 2  # SPEC §4.2: not published, default 2
B_MAX = 4  # SPEC §4.2: not published, default 4


@ROLLOUT_STRATEGIES.register("datpo_tree")
@produces("block_ids")
def datpo_tree(
    engine: RolloutEngine,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    group_size: int,
    score: ScoreFn,
    n_base: int = N_BASE,
    k_max: int = K_MAX,
    b_max: int = B_MAX,
    fork_unit: str = "sentence",
    reuse_kv_cache: bool = True,
    on_finished: FinishedFn | None = None,
    rows: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[Rollouts, Tensor]:
    """Difficulty-adaptive tree rollouts; `group_size` is unused (module docstring), and so
    is `on_finished`: the leaves are known only once the tree is grown; and `rows`: the tree
    reads the prompts' tokens only."""
    del group_size, on_finished, rows
    if n_base < 1:
        raise ValueError(f"datpo_tree: n_base must be >= 1, got {n_base}")
    pad_id = int(engine.pad_id)
    prompt_of = torch.arange(len(prompts)).repeat_interleave(n_base)  # base row -> prompt
    base_prompts = [p for p in prompts for _ in range(n_base)]
    if reuse_kv_cache and not (engine.tree_rollouts or engine.prefix_cache):
        raise TypeError(
            "datpo_tree with reuse_kv_cache needs the 'hf' engine or an engine whose "
            f"continuations find the prefix cached (vllm with prefix caching), got {engine!r}; "
            "or set reuse_kv_cache=false"
        )
    if reuse_kv_cache and engine.tree_rollouts:
        base, kept = engine.generate_with_cache(base_prompts, params)
    else:  # the hf engine's prefill per fork, or the engine's own continuations (vllm)
        base, kept = engine.generate(base_prompts, params), None
    require_entropies(base, "datpo_tree's forks")
    rewards = score(base, prompt_of).float()
    v_root = torch.zeros(len(prompts)).index_add_(0, prompt_of, rewards) / n_base
    k_b = [adaptive_budget(float(v), k_max, b_max) for v in v_root]  # (K̂, B̂) per prompt
    forks = [
        choose_forks(_candidates(engine, base, row, fork_unit), k_b[p][0]) if k_b[p][1] else []
        for row, p in enumerate(prompt_of.tolist())
    ]
    base_blocks, first_free = _base_block_ids(base, forks)
    base = replace(base, structure={**base.structure, "block_ids": base_blocks})
    # One entry per fork point: its base row, position t and number of branches B̂.
    rows = [r for r, ts in enumerate(forks) for _ in ts]
    if not rows:
        return base, prompt_of
    at = [t for ts in forks for t in ts]
    count = [k_b[int(prompt_of[r])][1] for r in rows]
    budgets = [params.max_new_tokens - t for t in at]
    if kept is not None:
        cont = branches_from_cache(engine, kept, base, rows, at, budgets, count, params)  # type: ignore[arg-type]
    else:
        cont = sample_branches(
            engine,
            [
                prompts[int(prompt_of[r])] + base.response_ids[r, :t].tolist()
                for r, t in zip(rows, at, strict=True)
            ],
            budgets,
            count,
            params,
        )
    del kept
    # Per branch: its base row and fork position (sample_branches keeps the fork order).
    src = torch.tensor(rows).repeat_interleave(torch.tensor(count))
    fork_at = torch.tensor(at).repeat_interleave(torch.tensor(count))
    branches = _splice(base, cont, src, fork_at, pad_id)
    branches.structure["block_ids"] = _branch_block_ids(
        base_blocks,
        src,
        fork_at,
        first_free + torch.arange(len(src)),
        branches.response_ids.shape[1],
    )
    return concat_rollouts([base, branches], pad_id), torch.cat([prompt_of, prompt_of[src]])


def _candidates(
    engine: RolloutEngine, base: Rollouts, row: int, fork_unit: str
) -> list[tuple[int, float]]:
    """Fork candidates of base response `row` (its token texts need the engine's tokenizer)."""
    length = int(base.lengths[row])
    ids = base.response_ids[row, :length].tolist()
    if fork_unit == "sentence":
        tokenizer = engine.tokenizer
        if tokenizer is None:
            raise TypeError("datpo_tree with sentence forks needs an engine with a .tokenizer")
        pieces = token_pieces(tokenizer, ids)
    else:
        pieces = [""] * length
    return candidate_scores(pieces, base.entropies[row, :length], fork_unit)


def _base_block_ids(base: Rollouts, forks: list[list[int]]) -> tuple[Tensor, int]:
    """Block ids [N, R] of the base rows (segment j of row r: between its forks j-1 and j),
    -1 on padding; and the first id not used."""
    ids = torch.full(base.response_ids.shape, -1, dtype=torch.long)
    cols = torch.arange(base.response_ids.shape[1])
    next_id = 0
    for row, ts in enumerate(forks):
        segment = (cols[:, None] >= torch.tensor(ts, dtype=torch.long)[None, :]).sum(1)
        ids[row] = torch.where(base.response_mask[row] > 0, next_id + segment, -1)
        next_id += len(ts) + 1
    return ids, next_id


def _branch_block_ids(
    base_blocks: Tensor, src: Tensor, at: Tensor, new_ids: Tensor, width: int
) -> Tensor:
    """A branch's prefix tokens keep its base's block ids; its continuation is one new block."""
    cols = torch.arange(width)[None, :]
    prefix = _pad_to(base_blocks[src], width, -1)
    return torch.where(cols < at[:, None], prefix, new_ids[:, None].expand(-1, width))


def _pad_to(x: Tensor, width: int, value: float) -> Tensor:
    """Right-pad (or crop) dim 1 of [n, R] or [n, R, d] to `width`."""
    pad = (0, 0, 0, width - x.shape[1]) if x.dim() == 3 else (0, width - x.shape[1])
    return torch.nn.functional.pad(x, pad, value=value)


def _splice(base: Rollouts, cont: Rollouts, src: Tensor, at: Tensor, pad_id: int) -> Rollouts:
    """Leaf i = [base row src[i], tokens 0..at[i]-1 | continuation i]: the prefix's ids,
    sampling log-probs, entropies (and hidden states) are the base's."""
    width = int((at + cont.lengths).max())
    cont_width = cont.response_ids.shape[1]
    offset = torch.arange(width)[None, :] - at[:, None]  # column in the continuation
    in_prefix, in_cont = offset < 0, (offset >= 0) & (offset < cont_width)
    take = offset.clamp(0, cont_width - 1)

    def join(b: Tensor, c: Tensor) -> Tensor:
        extra = (slice(None), slice(None)) + (None,) * (c.dim() - 2)  # broadcast over d
        post = c.gather(1, take[extra].expand(-1, -1, *c.shape[2:]))
        post = torch.where(in_cont[extra], post, torch.zeros_like(post))
        return torch.where(in_prefix[extra], _pad_to(b[src], width, 0), post)

    mask = join(base.response_mask, cont.response_mask)
    hidden = None
    if base.hidden is not None and cont.hidden is not None:
        hidden = join(base.hidden, cont.hidden)
    return Rollouts(
        prompt_ids=base.prompt_ids[src],
        prompt_mask=base.prompt_mask[src],
        response_ids=torch.where(mask > 0, join(base.response_ids, cont.response_ids), pad_id),
        response_mask=mask,
        logp=join(base.logp, cont.logp),
        entropies=join(base.entropies, cont.entropies),
        truncated=cont.truncated,
        generated_tokens=cont.generated_tokens,
        hidden=hidden,
    )
