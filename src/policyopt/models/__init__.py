"""Models: the embedded tiny model, loading by name, chunked log-probs, LoRA.

Exports are resolved on first access, so that importing one submodule (for instance
`policyopt.models.logprobs`, which needs only torch) does not import transformers and PEFT.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "build_tiny_model": "tiny",
    "tiny_model_path": "tiny",
    "build_char_tokenizer": "tiny",
    "load_model": "loading",
    "load_tokenizer": "loading",
    "smollm2_gguf_path": "loading",
    "LogProbOutput": "logprobs",
    "response_logprobs": "logprobs",
    "naive_response_logprobs": "logprobs",
    "chunked_head_logprobs": "logprobs",
    "position_ids_from_mask": "logprobs",
    "apply_lora": "lora",
    "merge_lora": "lora",
    "disabled_adapter": "lora",
}
__all__ = [
    "LogProbOutput",
    "apply_lora",
    "build_char_tokenizer",
    "build_tiny_model",
    "chunked_head_logprobs",
    "disabled_adapter",
    "load_model",
    "load_tokenizer",
    "merge_lora",
    "naive_response_logprobs",
    "position_ids_from_mask",
    "response_logprobs",
    "smollm2_gguf_path",
    "tiny_model_path",
]

if TYPE_CHECKING:
    from policyopt.models.loading import load_model, load_tokenizer, smollm2_gguf_path
    from policyopt.models.logprobs import (
        LogProbOutput,
        chunked_head_logprobs,
        naive_response_logprobs,
        position_ids_from_mask,
        response_logprobs,
    )
    from policyopt.models.lora import apply_lora, disabled_adapter, merge_lora
    from policyopt.models.tiny import build_char_tokenizer, build_tiny_model, tiny_model_path


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
