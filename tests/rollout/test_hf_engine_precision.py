"""The hf engine under bf16-mixed: bfloat16 trunk, float32 head, log-probs near a float32
forward's but no longer the trainer's own (so TIS turns on), float32 weights untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from policyopt.models.loading import load_model
from policyopt.models.logprobs import naive_response_logprobs, trunk_of
from policyopt.models.lora import apply_lora
from policyopt.models.precision import set_precision
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.hf_engine import HFEngine
from policyopt.train.trainer import resolve_tis_cap

PARAMS = SamplingParams(max_new_tokens=12, temperature=1.0)


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


@pytest.fixture
def mixed(tiny):
    model, tok = tiny
    set_precision(model, "bf16-mixed")
    yield model, tok
    set_precision(model, "fp32")


def prompts(tok) -> list[list[int]]:
    texts = ["Q:1+2=?\n", "Q:((7+12)-5)+9=?\n", "Q:3=?\n"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts for _ in range(4)]


def test_tis_turns_on_for_a_bf16_mixed_engine_only(tiny, mixed) -> None:
    model, tok = mixed
    engine = HFEngine(model, tok)
    assert not engine.exact_logprobs
    assert resolve_tis_cap("auto", engine.exact_logprobs) == 2.0
    set_precision(model, "fp32")
    assert engine.exact_logprobs and resolve_tis_cap("auto", engine.exact_logprobs) is None


@pytest.mark.parametrize("lean", [True, False])
def test_sampled_logprobs_are_near_a_float32_forward(mixed, lean) -> None:
    model, tok = mixed
    seen: list[torch.dtype] = []
    down = trunk_of(model).layers[0].mlp.down_proj  # a hook here keeps the lean step on
    hook = down.register_forward_hook(lambda _m, _a, out: seen.append(out.dtype))
    try:
        torch.manual_seed(0)
        r = HFEngine(model, tok, lean_decode=lean).generate(prompts(tok), PARAMS)
    finally:
        hook.remove()
    assert set(seen) == {torch.bfloat16} and len(seen) > 1  # prefill and decode steps
    with torch.no_grad():  # an independent float32 forward over the whole sequences
        exact = naive_response_logprobs(
            model, r.input_ids(), r.attention_mask(), r.response_ids.shape[1]
        ).logp
    m = r.response_mask.bool()
    gap = (r.logp[m] - exact[m]).abs()
    # bfloat16 rounding moves log-probs, not the distribution: close, but not equal.
    assert 0 < float(gap.mean()) < 0.01 and float(gap.max()) < 0.1
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_lean_decode_gives_the_forward_path_tokens(mixed) -> None:
    model, tok = mixed
    out = {}
    for lean in (True, False):
        torch.manual_seed(1)
        out[lean] = HFEngine(model, tok, lean_decode=lean).generate(prompts(tok), PARAMS)
    assert torch.equal(out[True].response_ids, out[False].response_ids)
    assert torch.allclose(out[True].logp, out[False].logp, atol=1e-3)


def test_lora_base_weights_are_float32_and_unchanged_after_sampling(tiny) -> None:
    _, tok = tiny
    model, _ = load_model("tiny")
    model = apply_lora(model, rank=2, alpha=4)
    set_precision(model, "bf16-mixed")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(2)
    r = HFEngine(model, tok).generate(prompts(tok), PARAMS)
    assert torch.isfinite(r.logp).all()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, before[name]), name
    assert any(isinstance(m, nn.Linear) and not m.weight.requires_grad for m in model.modules())
