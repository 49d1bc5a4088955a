"""DAPO overlong reward shaping (arXiv 2503.14476, SPEC section 1).

With maximum length L_max and buffer L_cache, a response of length |y| gets

    R_len(y) = 0                                   if |y| <= L_max - L_cache
             = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
             = -1                                  if |y| > L_max

added to its correctness reward: a linear ramp from 0 down to -1 across the buffer.

The `overlong` reward shaper adds R_len as a reward term (after the task reward's
transforms: `policyopt.rewards.shaping`). Options: `max_len` (L_max; None: the run's
`rollout.max_new_tokens`) and `cache_len` (L_cache; None: ⌈0.2 L_max⌉, the paper's ratio:
L_cache = 4096 of L_max = 20480, so that responses up to 16384 tokens are not penalised).
Overlong filtering, the paper's other remedy (the loss of truncated responses is masked),
is `algorithm.filter_truncated`.
"""

from __future__ import annotations

import torch

from policyopt.rewards.shaping import SHAPERS, RewardShaper, ShapingContext

CACHE_FRACTION = (1, 5)  # L_cache / L_max = 4096 / 20480 (DAPO, arXiv 2503.14476)


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


def default_cache_len(max_len: int) -> int:
    """⌈0.2 L_max⌉ in integers (4096 for L_max = 20480)."""
    num, den = CACHE_FRACTION
    return -(-max_len * num // den)


@SHAPERS.register("overlong")
class OverlongShaper(RewardShaper):
    """Adds R_len (module docstring) as the reward term `overlong`; the task reward passes
    through unchanged."""

    def __init__(self, max_len: int | None = None, cache_len: int | None = None) -> None:
        if max_len is not None:
            cache = default_cache_len(max_len) if cache_len is None else cache_len
            overlong_penalty(torch.zeros(1), max_len, cache)  # validates both
        elif cache_len is not None and cache_len < 0:
            raise ValueError(f"overlong: cache_len must be >= 0, got {cache_len}")
        self.max_len, self._cache_len = max_len, cache_len

    @property
    def cache_len(self) -> int | None:
        """L_cache, once L_max is known."""
        if self._cache_len is not None or self.max_len is None:
            return self._cache_len
        return default_cache_len(self.max_len)

    def __call__(
        self, rewards: torch.Tensor, ctx: ShapingContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        max_len = self.max_len or ctx.max_new_tokens
        if max_len is None:
            raise ValueError("overlong: set max_len (L_max); this context has no max_new_tokens")
        cache = default_cache_len(max_len) if self._cache_len is None else self._cache_len
        penalty = overlong_penalty(ctx.rollouts.lengths, max_len, cache).to(rewards.dtype)
        ctx.add_term("overlong", penalty)
        return rewards, {
            "overlong/penalty_mean": float(penalty.mean()),
            "overlong/penalised_fraction": float((penalty < 0).float().mean()),
        }
