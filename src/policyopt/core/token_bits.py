"""Sets of allowed tokens as packed bits: 32 tokens per int32 word, xgrammar's bitmask layout.

Constrained decoding records, for every response position, the tokens the grammar allowed
(rollout/grammar.py). As bools that is [N, R, V]: with SmolLM2's 49,152-token vocabulary,
64 rows of 120 tokens take 377 MB per batch; packed, [N, R, ceil(V / 32)] int32, 12 MB.
Token t is bit t mod 32 of word t // 32 (xgrammar's `allocate_token_bitmask` layout), so a
grammar's mask is stored as it comes, and -1 (all bits set) means "every token".
"""

from __future__ import annotations

import torch

_SHIFTS = torch.arange(32, dtype=torch.int32)


def unpack_token_bits(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """[..., W] int32 words -> [..., vocab] bool, vocab <= 32 W."""
    if vocab > 32 * words.shape[-1]:
        raise ValueError(f"{words.shape[-1]} words hold {32 * words.shape[-1]} tokens, not {vocab}")
    bits = (words.unsqueeze(-1) >> _SHIFTS.to(words.device)) & 1  # arithmetic shift: sign ok
    return bits.bool().flatten(-2)[..., :vocab]
