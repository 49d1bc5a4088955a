"""LoRA through PEFT: zero-initialised adapters, training, disabling and merging."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from policyopt.models.logprobs import naive_response_logprobs, response_logprobs
from policyopt.models.lora import apply_lora, disabled_adapter, merge_lora
from policyopt.models.tiny import build_tiny_model

SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
IDS = torch.tensor([[0, 0, 20, 21, 22, 23, 24, 25], [30, 31, 32, 33, 34, 35, 36, 37]])
MASK = (IDS != 0).long()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("lora"), seed=2, **SMALL)


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS, attention_mask=MASK).logits


def trained_rank1(model_dir):
    """(base logits, rank-1 adapted model after one SGD step)."""
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    base_logits = logits(base)
    model = apply_lora(base, rank=1, alpha=2)
    params = [p for p in model.parameters() if p.requires_grad]
    out = response_logprobs(model, IDS, MASK, 4)
    (-out.logp.sum()).backward()
    torch.optim.SGD(params, lr=0.5).step()
    return base_logits, model


def test_rank1_adapters_only_and_start_at_base(model_dir) -> None:
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    base_logits = logits(base)
    model = apply_lora(base, rank=1)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("lm_head" in n for n in trainable)  # all-linear leaves the LM head alone
    # rank 1: A is [1, in], B is [out, 1]; per layer q,k,v,o (32x32) + gate,up (32->64) + down
    per_layer = 4 * (32 + 32) + 2 * (32 + 64) + (64 + 32)
    assert sum(p.numel() for p in trainable.values()) == 2 * per_layer
    torch.testing.assert_close(logits(model), base_logits, atol=0, rtol=0)  # B starts at zero


def test_one_step_changes_output_and_disabled_adapter_gives_base(model_dir) -> None:
    base_logits, model = trained_rank1(model_dir)
    assert (logits(model) - base_logits).abs().max() > 1e-4
    with disabled_adapter(model) as ref:
        torch.testing.assert_close(logits(ref), base_logits, atol=1e-6, rtol=0)
    assert (logits(model) - base_logits).abs().max() > 1e-4  # adapter back on afterwards


def test_logprobs_through_peft_match_naive(model_dir) -> None:
    _, model = trained_rank1(model_dir)
    for ctx in (torch.enable_grad, lambda: disabled_adapter(model)):
        with ctx():
            got = response_logprobs(model, IDS, MASK, 4, chunk_size=3, with_entropy=True)
            ref = naive_response_logprobs(model, IDS, MASK, 4, with_entropy=True)
        torch.testing.assert_close(got.logp, ref.logp, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.entropies, ref.entropies, atol=1e-5, rtol=0)


def test_merge_gives_adapted_output(model_dir) -> None:
    _, model = trained_rank1(model_dir)
    adapted = logits(model)
    merged = merge_lora(model)
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(logits(merged), adapted, atol=1e-5, rtol=0)


def test_plain_model_and_bad_arguments(model_dir) -> None:
    plain = AutoModelForCausalLM.from_pretrained(model_dir)
    with disabled_adapter(plain) as same:
        assert same is plain
    with pytest.raises(TypeError, match="expected a PeftModel"):
        merge_lora(plain)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        apply_lora(plain, rank=0)
    with pytest.raises(ValueError, match="dropout"):
        apply_lora(plain, dropout=1.0)
    with pytest.raises(TypeError, match="already has adapters"):
        apply_lora(apply_lora(plain, rank=1))
