"""The gradient-reversal layer (Ganin & Lempitsky 2015) of the LRP's adversarial branch.

`grad_reverse(x, lam)` is the identity going forward and multiplies the incoming gradient
by −lam going backward: the encoder under it learns to make the population discriminator
fail (population-invariant features), while the discriminator itself learns normally.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, lam: float) -> Tensor:
        ctx.lam = float(lam)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return -ctx.lam * grad, None


def grad_reverse(x: Tensor, lam: float = 1.0) -> Tensor:
    """Identity forward; −lam × the gradient backward."""
    return GradReverse.apply(x, lam)
