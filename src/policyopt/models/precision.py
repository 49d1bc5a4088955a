"""Mixed precision: bfloat16 compute over float32 master weights (`model.precision`).

- `fp32`: every op in the parameters' own dtype (what `model.dtype` loaded).
- `bf16-mixed`: the trainable weights, their gradients and the optimizer's state stay
  float32; the trunk's forward (SFT, the update's log-probs, sampling in the hf engine)
  runs under `torch.autocast(device, torch.bfloat16)`, so its linear layers and attention
  compute in bfloat16 and their gradients flow back into the float32 weights.

What stays float32, and why:
- Adam's step: on bfloat16 weights a step smaller than 2^-8 of the weight rounds away.
- The residual stream and the norms: autocast leaves elementwise ops in their inputs'
  dtype, the embedding's output is float32, so each residual add promotes to float32.
- The LM head and all after it (logits, logsumexp, the sampled token's log-prob): autocast
  would round the logits to bfloat16 (8 bits of mantissa, about 0.03 at a logit of 10),
  and CPU autocast leaves log_softmax in its input's dtype. `head_logits` runs the head
  outside autocast. Measured on SmolLM2 (32 tokens x 8 samples): the mean gap between the
  trainer's and the sampler's log-probs of the sampled tokens is 0.037 with a bfloat16
  head, 0.015 with a float32 one.

The trainer's and the sampler's log-probs are then no longer equal (different kernels and
shapes round differently in bfloat16), so an hf engine on a bf16-mixed model reports
`exact_logprobs = False`, and `algorithm.tis_cap: auto` turns truncated importance sampling
on (core/tis.py). docs/guides/precision.md has the measurements.

The precision travels with the model (`set_precision`), as its dtype does, so that every
place that runs it (the update's `PolicyForward`, the hf engine, SFT) asks the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import nn

PRECISIONS = ("fp32", "bf16-mixed")
# The attribute that carries a model's precision; a plain Python attribute, so it is never
# saved with the weights (a checkpoint loads in whatever precision its next run asks for).
_ATTRIBUTE = "policyopt_precision"


def set_precision(model: nn.Module, precision: str) -> None:
    """Run `model` in `precision` (one of PRECISIONS) from now on. bf16-mixed needs float32
    trainable parameters: they are the master weights the optimizer steps."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"model.precision must be one of {', '.join(PRECISIONS)}; got {precision!r}"
        )
    if precision == "bf16-mixed":
        low = sorted(
            {
                str(p.dtype)
                for p in model.parameters()
                if p.requires_grad and p.dtype != torch.float32
            }
        )
        if low:
            raise ValueError(
                f"model.precision=bf16-mixed keeps float32 master weights, but the trainable "
                f"weights are {', '.join(low)} (model.dtype casts the weights themselves, and "
                "Adam's small steps round away in bfloat16): load with model.dtype=float32"
            )
    setattr(model, _ATTRIBUTE, precision)


def precision_of(model: nn.Module) -> str:
    """The precision `set_precision` gave `model` (through wrappers such as PEFT's, which
    pass unknown attributes on to the model they wrap); fp32 if none."""
    return getattr(model, _ATTRIBUTE, "fp32")


def is_mixed(model: nn.Module) -> bool:
    return precision_of(model) == "bf16-mixed"


def mixed_precision(model: nn.Module) -> AbstractContextManager[object]:
    """The context to run `model`'s forward in: bfloat16 autocast on its parameters' device
    under bf16-mixed, nothing under fp32. Backward runs outside it (autograd replays each
    op in the dtype its forward used)."""
    if not is_mixed(model):
        return nullcontext()
    device = next(model.parameters()).device
    return torch.autocast(device.type, dtype=torch.bfloat16)


def head_logits(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """`head(hidden)` outside autocast, its input in the head's own dtype: float32 logits from
    float32 hidden states and weights under bf16-mixed (module docstring); exactly
    `head(hidden)` otherwise."""
    with torch.autocast(hidden.device.type, enabled=False):
        return head(hidden.to(_dtype_of(head)))


def _dtype_of(module: nn.Module) -> torch.dtype:
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.dtype
    return next(module.parameters()).dtype


@contextmanager
def frozen_linears_in_bf16(model: nn.Module, skip: nn.Module | None = None) -> Iterator[None]:
    """Under bf16-mixed: bfloat16 copies of the frozen float32 weights and biases of the
    linear layers of `model` (but `skip`, the LM head) for the duration, the originals put
    back on exit. Autocast keeps one bfloat16 copy of a trainable weight per autocast region
    but casts a frozen one (a LoRA base layer) again at every call: at one call per token
    while decoding, that cast costs more than the bfloat16 matmul saves. The copies hold the
    same values autocast's casts would give. Only for no-grad code that runs every forward
    of `model` under `mixed_precision` (a float32 input meets a bfloat16 weight otherwise)."""
    if not is_mixed(model):
        yield
        return
    head_params = set() if skip is None else {id(p) for p in skip.parameters()}
    originals: list[tuple[nn.Parameter, torch.Tensor]] = []
    seen: set[int] = set()
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        for p in (module.weight, module.bias):
            if p is None or p.requires_grad or p.dtype != torch.float32:
                continue
            if id(p) in seen or id(p) in head_params:  # tied or the head: left alone
                continue
            seen.add(id(p))
            originals.append((p, p.data))
            p.data = p.data.to(torch.bfloat16)
    try:
        yield
    finally:
        for p, data in originals:
            p.data = data
