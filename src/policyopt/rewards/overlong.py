"""DAPO overlong reward shaping (arXiv 2503.14476, SPEC section 1).

With maximum length L_max and buffer L_cache, a response of length |y| gets

    R_len(y) = 0                                   if |y| <= L_max - L_cache
             = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
             = -1                                  if |y| > L_max

added to its correctness reward: a linear ramp from 0 down to -1 across the buffer.
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """R_len for each response length in `lengths` (any shape); float tensor, values in [-1, 0].

    `cache_len` = 0 is a hard cut: 0 up to `max_len`, -1 beyond.
    """
    if max_len <= 0:
        raise ValueError(f"overlong_penalty: max_len must be > 0, got {max_len}")
    if not 0 <= cache_len <= max_len:
        raise ValueError(
            f"overlong_penalty: cache_len must be in [0, max_len={max_len}], got {cache_len}"
        )
    y = lengths.to(torch.get_default_dtype())
    threshold = max_len - cache_len  # L_max - L_cache: where the penalty starts
    ramp = (threshold - y) / max(cache_len, 1)  # only used inside the buffer, where cache_len >= 1
    penalty = torch.where(y <= threshold, torch.zeros_like(y), ramp)
    return torch.where(y > max_len, torch.full_like(y, -1.0), penalty)
