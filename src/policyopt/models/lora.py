"""LoRA adapters through PEFT: add, merge, and temporarily switch off.

With an adapter the base weights stay frozen, so the reference policy of the KL term is the
same model with the adapter disabled (`disabled_adapter`): no second copy in memory.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from torch import nn
from transformers import PreTrainedModel

if TYPE_CHECKING:
    from peft import PeftModel


def is_peft_model(model: object) -> bool:
    """Whether `model` carries peft adapters, without importing peft: no model is a PeftModel
    unless peft was imported, and importing it loads torch's compiler stack (sympy among
    it), which a run without LoRA does not need."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def apply_lora(
    model: PreTrainedModel,
    *,
    rank: int = 8,
    alpha: float = 16,
    target_modules: list[str] | str = "all-linear",
    dropout: float = 0.0,
) -> PeftModel:
    """Wrap `model` with LoRA adapters (W + (alpha / rank) B A, B initialised to zero).

    `"all-linear"` targets every linear layer except the LM head; only adapter weights
    remain trainable.
    """
    from peft import LoraConfig, get_peft_model

    if is_peft_model(model):
        raise TypeError("apply_lora: model already has adapters (it is a PeftModel)")
    if rank < 1:
        raise ValueError(f"apply_lora: rank must be >= 1, got {rank}")
    if alpha <= 0:
        raise ValueError(f"apply_lora: alpha must be > 0, got {alpha}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"apply_lora: dropout must be in [0, 1), got {dropout}")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=target_modules,
        lora_dropout=dropout,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def merge_lora(model: PeftModel) -> PreTrainedModel:
    """Fold the adapters into the base weights and return the plain model.

    The base model is modified in place; `model` should not be used afterwards.
    """
    if not is_peft_model(model):
        raise TypeError(f"merge_lora: expected a PeftModel, got {type(model).__name__}")
    return model.merge_and_unload()


@contextmanager
def disabled_adapter(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, `model` computes the base model's outputs (no-op for a plain model)."""
    if is_peft_model(model):
        with model.disable_adapter():
            yield model
    else:
        yield model
