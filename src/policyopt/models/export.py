"""The policy's weights as a plain Hugging Face model: for an inference engine (vLLM) to load.

A PEFT-wrapped policy is exported as its base model (the adapters go separately, see
`save_adapter`); a model transformers dequantised from GGUF is exported as plain weights (its
quantizer and quantization config cleared, else `from_pretrained` would look for GGUF again).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from policyopt.models.lora import is_peft_model

if TYPE_CHECKING:
    from peft import PeftModel


def base_model(model: nn.Module) -> PreTrainedModel:
    """The Hugging Face model under a PEFT wrapper (or `model` itself)."""
    return model.get_base_model() if is_peft_model(model) else model  # type: ignore[return-value]


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base weights under Hugging Face checkpoint names (no copy): LoRA factors left out,
    PEFT's wrapped `<layer>.base_layer.weight` named `<layer>.weight`, and a tied LM head
    left out (the loader ties it to the embeddings)."""
    base = base_model(model)
    out = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    if getattr(base.config, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)
    return out


def save_plain_model(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, folder: str | Path
) -> Path:
    """Write `model`'s base weights (safetensors), config, generation config and tokenizer."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    base = base_model(model)
    config = copy.deepcopy(base.config)
    if hasattr(config, "quantization_config"):  # dequantised GGUF: plain weights now
        del config.quantization_config
    config.save_pretrained(folder)
    if base.generation_config is not None:
        base.generation_config.save_pretrained(folder)
    weights = {k: v.detach().contiguous().cpu() for k, v in plain_state_dict(model).items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
    return folder


def save_adapter(model: PeftModel, folder: str | Path) -> Path:
    """Write the LoRA adapter alone (PEFT's adapter_config.json + adapter_model.safetensors)."""
    folder = Path(folder)
    model.save_pretrained(folder)
    return folder
