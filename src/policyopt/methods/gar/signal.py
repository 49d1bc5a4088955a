"""GAR's gradient signal of a response at the LM head (SPEC §3, steps 1-3).

For the hidden states h_t [d] that enter the output projection (W [V, d], bias b [V]) and the
tokens y_t they predict, with L = (1/T) Σ_t CE(W h_t + b, y_t):

    G_t = ∂L/∂h_t = W^T (softmax(W h_t + b) − onehot(y_t)) / T      (closed form)
    S_t = G_t ⊙ h_t                                                  per dimension j:
    S_t,j = [W^T (p_t − e_y)]_j / T  ·  h_t,j     (prediction-error factor × activation factor)
    v = s̄ / ||s̄||₂,   s̄ = (1/T) Σ_t S_t

Only the output layer is differentiated (truncated backprop): the trunk's hidden states are
inputs. Logits are formed `chunk_size` tokens at a time, so no [T, V] tensor exists at once.
"""

from __future__ import annotations

import torch
from torch import nn

NORM_EPS = 1e-12  # ||s̄|| below this leaves v = 0 (an empty span or a degenerate signal)


def prediction_error_factor(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
) -> torch.Tensor:
    """W^T (softmax(W h_t + b) − onehot(y_t)) for each row of `hidden` [n, d]: [n, d] in
    float32 (float64 for a float64 head). One [n, V] logit buffer; callers chunk the rows."""
    acc = _accumulation_dtype(weight)
    z = nn.functional.linear(hidden.to(weight.dtype), weight, bias).to(acc)  # W h + b
    p = torch.softmax(z, dim=-1)  # p_t
    p[torch.arange(len(targets), device=p.device), targets] -= 1.0  # p_t − e_{y_t}
    return (p.to(weight.dtype) @ weight).to(acc)  # W^T (p_t − e_{y_t})


def _accumulation_dtype(weight: torch.Tensor) -> torch.dtype:
    return torch.promote_types(weight.dtype, torch.float32)


def _check(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> None:
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"gradient_signal: hidden size {hidden.shape[-1]} does not match weight "
            f"{tuple(weight.shape)} ([V, d])"
        )
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"gradient_signal: targets {tuple(targets.shape)} do not match hidden "
            f"{tuple(hidden.shape)}"
        )
    if chunk < 1:
        raise ValueError(f"gradient_signal: chunk_size must be >= 1, got {chunk}")


def batched_gradient_signal(
    hidden: torch.Tensor,
    mask: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """v [N, d] for N responses: `hidden` [N, T, d], `mask` [N, T] (1 = token in the span),
    `targets` [N, T]. Row i's T_i = mask[i].sum(); a row with no tokens gets v = 0.

    The valid tokens of all rows are flattened and processed `chunk_size` at a time.
    """
    _check(hidden, weight, targets, chunk_size)
    if mask.shape != targets.shape:
        raise ValueError(f"gradient_signal: mask {tuple(mask.shape)} != targets shape")
    n, _, d = hidden.shape
    keep = mask.bool()
    rows = keep.nonzero()[:, 0]  # row of each valid token
    h, y = hidden[keep], targets[keep]  # [M, d], [M]
    acc = _accumulation_dtype(weight)
    s_sum = torch.zeros(n, d, dtype=acc, device=hidden.device)  # Σ_t [W^T (p_t − e_y)] ⊙ h_t
    for start in range(0, len(y), chunk_size):
        c = slice(start, start + chunk_size)
        factor = prediction_error_factor(h[c], weight, bias, y[c])
        s_sum.index_add_(0, rows[c], factor * h[c].to(acc))
    t = keep.sum(-1).clamp(min=1).to(acc)  # T_i
    s_bar = s_sum / (t * t)[:, None]  # one 1/T from G_t, one from the mean over t
    return nn.functional.normalize(s_bar, dim=-1, eps=NORM_EPS)


def gradient_signal(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """v [d] of one response: `hidden` [T, d] (the LM head's inputs), `targets` [T] (the
    tokens they predict), `weight` [V, d] and `bias` [V] (or None) of the LM head."""
    _check(hidden, weight, targets, chunk_size)
    mask = torch.ones_like(targets, dtype=torch.bool)[None]
    return batched_gradient_signal(hidden[None], mask, weight, bias, targets[None], chunk_size)[0]


def output_layer(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head's effective (W [V, d], b [V] or None) of a Hugging Face or PEFT model.

    Tied input/output embeddings are one tensor, returned as is. A LoRA-wrapped head
    contributes W_base + Σ_active (alpha/r) B A, unless its adapters are merged or disabled.
    """
    head = model.get_output_embeddings()
    base = getattr(head, "base_layer", None)
    if base is None:
        return head.weight, getattr(head, "bias", None)
    weight = base.weight
    if not getattr(head, "merged", False) and not getattr(head, "disable_adapters", False):
        for name in getattr(head, "active_adapters", []):
            if name in getattr(head, "lora_A", {}):
                weight = weight + head.get_delta_weight(name).to(weight.dtype)
    return weight, getattr(base, "bias", None)
