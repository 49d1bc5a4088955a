"""LoRA adapters through PEFT: add, merge, and temporarily switch off.

With an adapter the base weights stay frozen, so the reference policy of the KL term is the
same model with the adapter disabled (`disabled_adapter`): no second copy in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import PreTrainedModel


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
    if isinstance(model, PeftModel):
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
    if not isinstance(model, PeftModel):
        raise TypeError(f"merge_lora: expected a PeftModel, got {type(model).__name__}")
    return model.merge_and_unload()


@contextmanager
def disabled_adapter(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, `model` computes the base model's outputs (no-op for a plain model)."""
    if isinstance(model, PeftModel):
        with model.disable_adapter():
            yield model
    else:
        yield model
