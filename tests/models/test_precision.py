"""bf16-mixed (models/precision.py): bfloat16 linear layers under autocast, a float32 LM head
and log-probs, float32 weights and gradients; fp32 changes nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from policyopt.models.logprobs import response_hidden, response_logprobs, trunk_of
from policyopt.models.lora import apply_lora
from policyopt.models.precision import (
    frozen_linears_in_bf16,
    head_logits,
    is_mixed,
    mixed_precision,
    precision_of,
    set_precision,
)
from policyopt.models.tiny import build_tiny_model

SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("precision"), seed=3, **SMALL)


def load(model_dir, precision: str = "fp32") -> nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    set_precision(model, precision)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor, int]:
    """Two rows: a left-padded prompt of 3 and one of 5 tokens, responses of 6 tokens."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 100, (2, 11), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    return ids, mask, 6


def linear_output_dtypes(model: nn.Module) -> tuple[dict[str, torch.dtype], list]:
    """Hooks recording the output dtype of every linear layer by name (remove them after)."""
    seen: dict[str, torch.dtype] = {}
    hooks = [
        m.register_forward_hook(lambda _m, _a, out, name=name: seen.__setitem__(name, out.dtype))
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
    ]
    return seen, hooks


def test_set_precision_checks_the_name_and_float32_master_weights(model_dir) -> None:
    model = load(model_dir)
    assert precision_of(model) == "fp32" and not is_mixed(model)
    with pytest.raises(ValueError, match="one of fp32, bf16-mixed"):
        set_precision(model, "bf16")
    set_precision(model, "bf16-mixed")
    assert is_mixed(model)
    # A LoRA wrapper passes the question on to the model it wraps.
    assert is_mixed(apply_lora(model, rank=2, alpha=4))
    bf16 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="model.dtype=float32"):
        set_precision(bf16, "bf16-mixed")


def test_trunk_linear_layers_run_in_bf16_and_the_head_in_fp32(model_dir) -> None:
    model = load(model_dir, "bf16-mixed")
    ids, mask, width = batch()
    seen, hooks = linear_output_dtypes(model)
    try:
        with mixed_precision(model):
            hidden = response_hidden(model, ids, mask, width)
            logp = response_logprobs(model, ids, mask, width).logp
            head_out = head_logits(model.get_output_embeddings(), hidden)
    finally:
        for h in hooks:
            h.remove()
    trunk = {k: v for k, v in seen.items() if k != "lm_head"}
    assert len(trunk) == 2 * 7 and set(trunk.values()) == {torch.bfloat16}
    assert seen["lm_head"] == torch.float32 and head_out.dtype == torch.float32
    assert hidden.dtype == torch.float32  # the residual stream and the final norm
    # The log-probs are those of a float64 head and log-softmax on the same hidden states:
    # a bfloat16 head (logits rounded to 8 bits) would be off by about 1e-2.
    weight = model.get_output_embeddings().weight.double()
    reference = torch.log_softmax(hidden.double() @ weight.T, -1)
    reference = reference.gather(-1, ids[:, -width:, None]).squeeze(-1)
    assert logp.dtype == torch.float32
    assert torch.allclose(logp.double(), reference, atol=2e-5)


def test_bf16_mixed_logprobs_are_near_fp32_but_not_equal(model_dir) -> None:
    ids, mask, width = batch()
    with torch.no_grad():
        exact = response_logprobs(load(model_dir), ids, mask, width).logp
        mixed_model = load(model_dir, "bf16-mixed")
        with mixed_precision(mixed_model):
            mixed = response_logprobs(mixed_model, ids, mask, width).logp
    gap = (mixed - exact).abs()
    assert 0 < float(gap.mean()) < 0.02 and float(gap.max()) < 0.1


def test_fp32_precision_is_the_model_as_it_was(model_dir) -> None:
    ids, mask, width = batch()
    plain = AutoModelForCausalLM.from_pretrained(model_dir)
    marked = load(model_dir, "fp32")
    with torch.no_grad(), mixed_precision(marked):
        got = response_logprobs(marked, ids, mask, width).logp
    assert torch.equal(got, response_logprobs(plain, ids, mask, width).logp.detach())


def test_gradients_reach_the_float32_weights(model_dir) -> None:
    ids, mask, width = batch()
    grads = {}
    for precision in ("fp32", "bf16-mixed"):
        model = load(model_dir, precision)
        with mixed_precision(model):
            logp = response_logprobs(model, ids, mask, width).logp
        (-logp.sum()).backward()  # outside autocast, as the update and SFT do
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
        grads[precision] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.isfinite(grads["bf16-mixed"]).all()
    cosine = nn.functional.cosine_similarity(grads["fp32"], grads["bf16-mixed"], dim=0)
    assert float(cosine) > 0.999


def test_frozen_linear_weights_are_bf16_inside_and_restored_after(model_dir) -> None:
    model = apply_lora(load(model_dir, "bf16-mixed"), rank=2, alpha=4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    head = model.get_output_embeddings()
    base_q = trunk_of(model).layers[0].self_attn.q_proj.base_layer.weight
    adapter = trunk_of(model).layers[0].self_attn.q_proj.lora_A["default"].weight
    with frozen_linears_in_bf16(model, skip=head):
        assert base_q.dtype == torch.bfloat16  # frozen: one cast for the whole context
        assert adapter.dtype == torch.float32  # trainable: autocast's own cache
        assert head.weight.dtype == torch.float32
        ids, mask, width = batch()
        with torch.no_grad(), mixed_precision(model):
            assert torch.isfinite(response_logprobs(model, ids, mask, width).logp).all()
    after = dict(model.named_parameters())
    assert all(torch.equal(before[n], after[n]) and after[n].dtype == torch.float32 for n in before)
    fp32 = apply_lora(load(model_dir), rank=2, alpha=4)
    with frozen_linears_in_bf16(fp32, skip=fp32.get_output_embeddings()):
        assert all(p.dtype == torch.float32 for p in fp32.parameters())
