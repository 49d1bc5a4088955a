"""One decode step of a Llama model through its own modules, without the model's forward.

At decode time (one new token per row, batch 64, a 4-layer model) the Hugging Face forward
spends as much on its per-call work as on the arithmetic: it builds the attention mask from
the 2-D padding mask at every token, dispatches the cache update through the cache object,
wraps outputs in dataclasses and resolves keyword arguments at every layer. `LlamaDecodeStep`
runs the same modules in the same order (embedding, rotary embedding, per layer: input norm,
q/k/v projections, `apply_rotary_pos_emb`, the cache layer's `update`, transformers' own SDPA
attention function, o projection, residual, post-attention norm, MLP, residual; final norm,
LM head), with the attention mask built once per decode, so its logits are the forward's
(tested equal). Module calls keep hooks and wrappers on the projections and the head working
(GAR's hook on the LM head, LoRA layers). Under bf16-mixed it runs inside the engine's
autocast and the head outside it (`models.precision.head_logits`), as the engine's forward
path does.

It serves only what it reproduces: exactly `LlamaForCausalLM` with its own layer classes,
SDPA attention, eval mode, no hooks on the model or its trunk, and a KV cache made of
preallocated layers; anything else decodes through the model's forward.
"""

from __future__ import annotations

import torch
from torch import nn

from policyopt.models.precision import head_logits

try:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.llama.modeling_llama import (
        LlamaAttention,
        LlamaDecoderLayer,
        LlamaForCausalLM,
        LlamaModel,
        apply_rotary_pos_emb,
    )
except ImportError:  # pragma: no cover - a transformers without these: always the forward
    LlamaForCausalLM = None


def _hooked(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or getattr(module, "_forward_hooks_with_kwargs", None)
    )


class LlamaDecodeStep:
    """`step(tokens [n], positions [n, 1], mask [n, 1, 1, kv] bool, cache) -> logits [n, V]`
    with the cache's layers updated in place (module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.trunk = model.model
        self.layers = list(self.trunk.layers)

    @classmethod
    def of(cls, model: nn.Module) -> LlamaDecodeStep | None:
        """The step for `model`, or None where the model's forward must run instead."""
        if LlamaForCausalLM is None or type(model) is not LlamaForCausalLM:
            return None
        trunk = model.model
        if type(trunk) is not LlamaModel or model.training:
            return None
        if getattr(model.config, "_attn_implementation", None) != "sdpa":
            return None
        layers = list(trunk.layers)
        if len(layers) != model.config.num_hidden_layers or any(
            type(layer) is not LlamaDecoderLayer or type(layer.self_attn) is not LlamaAttention
            for layer in layers
        ):
            return None
        if any(_hooked(m) for m in (model, trunk, *layers, *(la.self_attn for la in layers))):
            return None
        return cls(model)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: object
    ) -> torch.Tensor:
        trunk = self.trunk
        h = trunk.embed_tokens(tokens[:, None])  # [n, 1, d]
        position_embeddings = trunk.rotary_emb(h, position_ids=positions)
        cos, sin = position_embeddings
        layers = cache.layers  # type: ignore[attr-defined]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            residual = h
            x = layer.input_layernorm(h)
            shape = (*x.shape[:-1], -1, attn.head_dim)
            q = attn.q_proj(x).view(shape).transpose(1, 2)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k, v = layers[i].update(k, v)
            out, _ = sdpa_attention_forward(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
            out = out.reshape(*x.shape[:-1], -1).contiguous()
            h = residual + attn.o_proj(out)
            residual = h
            h = residual + layer.mlp(layer.post_attention_layernorm(h))
        # The head outside autocast: float32 logits under bf16-mixed (models/precision.py).
        return head_logits(self.model.lm_head, trunk.norm(h))[:, -1]
