"""DATPO's block advantages (SPEC §4.4-4.5), registered as the `datpo` estimator.

For a block b from node s to node e of a prompt's tree,

    A(b) = r(b) + V(e) − V(s),      V(node) = mean final reward of the leaves below it,

with r(b) the leaf's reward when b is a final block (0 otherwise) and V(leaf) = 0 past the
end (the usual terminal convention; otherwise the reward would count twice). Both cases are
A(b) = mean reward of the leaves holding b − mean reward of the leaves below s: for a final
block the only leaf holding it is its own. Every token takes its block's advantage.

Along one leaf's path root = n_0 → n_1 → … → n_m → leaf (blocks b_0..b_m) the tokens of b_j
get V(n_{j+1}) − V(n_j) for j < m and R − V(n_m) on the final block: the sum over the path
telescopes to R − V(root), the leaf's group-mean advantage, which is what a tree with no
forks gives (one block per row: A = R − mean of the group, Dr. GRPO's advantage). Forks
split that credit: a block is credited with how much the leaves below it beat those below
where it started.

Sibling-diversity bonus (optional input `diversity_bonus` [N, R], the per-token
λ(step) · d(b) written by the `datpo_diversity` shaper): added to A(b) only where A(b) > 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from policyopt.core.advantages import ADVANTAGES
from policyopt.core.structure import needs
from policyopt.methods.datpo.tree_blocks import TreeBlocks, node_values, tree_blocks

_ROUNDING = 1e-6  # |A| at or below this (times max(1, max |R|)) is rounding: A = 0


def block_advantages(tree: TreeBlocks, rewards: Tensor) -> Tensor:
    """A(b) = V(end of b) − V(start of b) for each block [B] (see module docstring).

    Differences of means that are equal up to rounding (a group of equal rewards 0.1, whose
    mean is 0.10000000000000002) are set to exactly 0, so that such a block is neither
    pushed nor counted as positive for the diversity bonus.
    """
    v_start, v_end = node_values(tree, rewards)
    adv = v_end - v_start
    scale = float(rewards.abs().max()) if rewards.numel() else 0.0
    return adv.masked_fill(adv.abs() <= _ROUNDING * max(scale, 1.0), 0.0)


def per_block(tree: TreeBlocks, per_token: Tensor) -> Tensor:
    """The value a per-token tensor [N, R] holds on each block's tokens [B] (its last write;
    every token of a block carries the same value)."""
    valid = tree.token_block >= 0
    out = torch.zeros(tree.num_blocks, dtype=per_token.dtype)
    out[tree.token_block[valid]] = per_token[valid]
    return out


@ADVANTAGES.register("datpo")
@needs("block_ids", "response_mask", optional=("diversity_bonus",))
def datpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    block_ids: Tensor | None = None,
    response_mask: Tensor | None = None,
    diversity_bonus: Tensor | None = None,
) -> Tensor:
    """Per-token advantages [N, R]: each token's block advantage (plus the diversity bonus on
    positive blocks). `block_ids` and `response_mask` [N, R] come from the `datpo_tree` rollout
    strategy (the trainer passes them from the rollouts' structure)."""
    if block_ids is None or response_mask is None:
        raise ValueError(
            "the datpo advantage needs per-token block_ids and response_mask: use it with "
            "rollout.strategy=datpo_tree"
        )
    tree = tree_blocks(block_ids, response_mask, group_ids)
    adv = block_advantages(tree, rewards)
    if diversity_bonus is not None:
        adv = adv + torch.where(adv > 0, per_block(tree, diversity_bonus.to(adv.dtype)), 0.0)
    valid = tree.token_block >= 0
    return torch.where(valid, adv[tree.token_block.clamp(min=0)], 0.0)
