"""Packing allowed-token sets into xgrammar's int32 words, for tests: the library only reads
packed masks (xgrammar writes them), so the writer lives here, built one bit at a time."""

import torch


def pack_token_bits(allowed: torch.Tensor) -> torch.Tensor:
    """[..., V] bool -> [..., ceil(V / 32)] int32: token t is bit t % 32 of word t // 32
    (bit 31 is the sign bit)."""
    *lead, vocab = allowed.shape
    flat = allowed.reshape(-1, vocab)
    words = torch.zeros(flat.shape[0], -(-vocab // 32), dtype=torch.int64)
    for i, t in flat.nonzero().tolist():
        words[i, t // 32] |= 1 << (t % 32)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.reshape(*lead, words.shape[-1])
