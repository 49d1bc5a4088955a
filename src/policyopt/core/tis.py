"""Truncated importance sampling (TIS) between the sampler's and the trainer's policies.

An inference engine (vLLM) samples with kernels, precision and batching that differ from the
trainer's, so its log-probs of the tokens it sampled, log π_sampler, are not exactly the
trainer's log π_old of the same weights: the "on-policy" batch is slightly off-policy. So is
the hf engine's under bfloat16 compute (`model.precision=bf16-mixed`): one token at a time
against a KV cache rounds differently from the trainer's forward over whole sequences.
Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (2025),
correct it by weighting each token's policy-gradient loss with the truncated ratio

    w_{i,t} = min(π_old(y_{i,t}) / π_sampler(y_{i,t}), C),

a constant (no gradient) with cap C (they use C = 2); `tis_weights` gives w. Losses at the
sequence level (GSPO's sequence ratio, HISPO's segments) use the sequence-level weight with
GSPO's length normalisation, w_i = min(exp((1/|y_i|) Σ_t (log π_old − log π_sampler)), C).
The trainer computes both once per micro-batch (`ISWeights`) and passes them into the loss
(`policyopt.core.losses.LossInputs`), which multiplies its loss terms by the weights of its
own level before aggregating, as verl's losses apply `rollout_is_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Yao et al. (2025) cap the weight at C = 2: algorithm.tis_cap="auto" with a vLLM engine.
DEFAULT_TIS_CAP = 2.0
# log w is clamped before exp, as log ρ is in the losses, so that a wild token cannot overflow.
MAX_LOG_WEIGHT = 20.0


def tis_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float) -> Tensor:
    """w_{i,t} = min(exp(log π_old − log π_sampler), C) per token [N, T]; 0 on padding."""
    _check(old_logp, sampler_logp, mask, cap)
    valid = mask.bool()
    log_w = torch.where(valid, old_logp.float() - sampler_logp.float(), 0.0)
    w = log_w.clamp(max=MAX_LOG_WEIGHT).exp().clamp(max=cap)
    return torch.where(valid, w, 0.0).detach()


def sequence_tis_weights(
    old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float
) -> Tensor:
    """w_i = min(exp(mean_t(log π_old − log π_sampler)), C) per sequence [N] (1 for an empty
    sequence: nothing to correct)."""
    _check(old_logp, sampler_logp, mask, cap)
    valid = mask.bool()
    diff = torch.where(valid, old_logp.float() - sampler_logp.float(), 0.0)
    mean = diff.sum(-1) / valid.sum(-1).clamp(min=1)
    return mean.clamp(max=MAX_LOG_WEIGHT).exp().clamp(max=cap).detach()


def _check(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float) -> None:
    if old_logp.dim() != 2 or old_logp.shape != sampler_logp.shape or old_logp.shape != mask.shape:
        raise ValueError(
            "tis: old_logp, sampler_logp and mask must be [N, T] of one shape, got "
            f"{tuple(old_logp.shape)}, {tuple(sampler_logp.shape)}, {tuple(mask.shape)}"
        )
    if not cap > 0:
        raise ValueError(f"tis: the cap C must be > 0, got {cap}")


@dataclass(frozen=True)
class ISWeights:
    """Truncated importance weights of a micro-batch at both levels: per token [N, T] (0 on
    padding) and per sequence [N]. A loss takes the level its objective uses."""

    token: Tensor
    sequence: Tensor

    @staticmethod
    def of(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float) -> ISWeights:
        return ISWeights(
            tis_weights(old_logp, sampler_logp, mask, cap),
            sequence_tis_weights(old_logp, sampler_logp, mask, cap),
        )

    def token_mean(self, mask: Tensor) -> float:
        """Mean token weight over the masked tokens."""
        return float(self.token.sum() / mask.sum().clamp(min=1))

    def sequence_mean(self) -> float:
        return float(self.sequence.mean()) if len(self.sequence) else 1.0
