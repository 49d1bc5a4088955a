"""The tree behind a batch of leaves, rebuilt from per-token block ids (SPEC §4.4).

Every leaf is a row: its full response, prompt to end. The tree strategy tags each response
token with the id of the block it belongs to; blocks are the non-overlapping pieces of the tree
cut at the fork points, so the tokens a branch shares with its base carry the base's block ids.
Ids need only be unique within a prompt's tree: a block is keyed by (group id, block id).

From the ids alone (`tree_blocks`):
- a row's path is its blocks in order; a block's parent is the block before it on any path
  that holds it (none: the block starts at the root);
- the leaves below the node that ends block b are the rows that hold b, so the Monte-Carlo
  value there is V(end of b) = mean reward of those rows; for a final block that is the leaf's
  own reward;
- V(start of b) = V(end of parent), or V(root) = mean reward of the group's leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TreeBlocks:
    """Blocks of a batch, indexed 0..B-1."""

    token_block: Tensor  # [N, R] long: block index of each token, -1 on padding
    holds: Tensor  # [B, N] bool: row n's path contains block b
    parent: Tensor  # [B] long: parent block, -1 for a block that starts at the root
    group: Tensor  # [B] long: dense group index (0..G-1) of the block's prompt
    row_group: Tensor  # [N] long: dense group index of each row

    @property
    def num_blocks(self) -> int:
        return self.holds.shape[0]


def tree_blocks(block_ids: Tensor, response_mask: Tensor, group_ids: Tensor) -> TreeBlocks:
    """Rebuild the blocks and their parents from block ids [N, R] (see module docstring)."""
    if block_ids.shape != response_mask.shape or block_ids.shape[0] != group_ids.shape[0]:
        raise ValueError(
            f"block_ids {tuple(block_ids.shape)}, response_mask {tuple(response_mask.shape)} and "
            f"group_ids {tuple(group_ids.shape)} do not match"
        )
    n, width = block_ids.shape
    valid = response_mask.bool()
    _, row_group = torch.unique(group_ids, return_inverse=True)
    keys = torch.stack([row_group[:, None].expand(n, width), block_ids.long()], -1)[valid]
    uniq, inverse = torch.unique(keys, dim=0, return_inverse=True)
    token_block = torch.full((n, width), -1, dtype=torch.long)
    token_block[valid] = inverse
    rows = torch.arange(n)[:, None].expand(n, width)[valid]
    holds = torch.zeros(len(uniq), n, dtype=torch.bool)
    holds[inverse, rows] = True
    parent = torch.full((len(uniq),), -2, dtype=torch.long)
    for r in range(n):
        path = torch.unique_consecutive(token_block[r][valid[r]]).tolist()
        if len(path) != len(set(path)):
            raise ValueError(f"row {r}: a block appears twice on its path {path}")
        for before, block in zip([-1, *path[:-1]], path, strict=True):
            if parent[block] not in (-2, before):
                raise ValueError(f"block {block} has two parents: not a tree")
            parent[block] = before
    return TreeBlocks(token_block, holds, parent, uniq[:, 0], row_group)


def node_values(tree: TreeBlocks, rewards: Tensor) -> tuple[Tensor, Tensor]:
    """(V(start of b) [B], V(end of b) [B]): mean rewards of the leaves below each node."""
    held = tree.holds.to(rewards.dtype)
    v_end = held @ rewards / held.sum(1)
    groups = int(tree.row_group.max()) + 1
    count = torch.zeros(groups, dtype=rewards.dtype).index_add_(
        0, tree.row_group, torch.ones_like(rewards)
    )
    v_root = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, tree.row_group, rewards) / count
    has_parent = tree.parent >= 0
    v_start = torch.where(has_parent, v_end[tree.parent.clamp(min=0)], v_root[tree.group])
    return v_start, v_end


def siblings(tree: TreeBlocks) -> Tensor:
    """[B, B] bool: the branches of one fork, i.e. blocks with the same parent block (the
    base's own continuation and the branches sampled there), a block not being its own
    sibling. Blocks that start at the root are the base rollouts, sampled independently
    rather than forked: they are not siblings of each other (SPEC §4.5: "same fork")."""
    forked = tree.parent >= 0
    same_parent = tree.parent[:, None] == tree.parent[None, :]
    same_group = tree.group[:, None] == tree.group[None, :]
    alone = ~torch.eye(tree.num_blocks, dtype=torch.bool)
    return same_parent & same_group & forked[:, None] & forked[None, :] & alone
