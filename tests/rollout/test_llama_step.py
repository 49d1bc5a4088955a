"""The direct Llama decode step: the model forward's logits, the same samples, and the
forward where it cannot reproduce it."""

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from policyopt.models.loading import load_model
from policyopt.models.tiny import tiny_config
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.hf_engine import HFEngine, left_pad, positions, preallocate
from policyopt.rollout.llama_step import LlamaDecodeStep


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    model, tok = load_model("tiny")
    return model.eval(), tok


def texts(tok) -> list[list[int]]:
    return [
        tok(t, add_special_tokens=False)["input_ids"]
        for t in ["Q:1+2=?\n", "Q:((7+12)-5)+9=?\n", "Q:3=?\n", "Q:12*3=?\n"]
    ]


def _decode_both(model: torch.nn.Module, prompts: list[list[int]], steps: int):
    """Logits of `steps` decode steps through the forward and through the direct step,
    each from its own copy of the prefill's cache, feeding the same tokens."""
    ids, mask = left_pad(prompts, 0)
    pos = positions(mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        base = preallocate(out.past_key_values, steps)
        caches = [base, copy.deepcopy(base)]
        full = torch.cat([mask, mask.new_ones(len(prompts), steps)], 1)
        step = LlamaDecodeStep.of(model)
        assert step is not None
        gen = torch.Generator().manual_seed(0)
        p, width, got = pos[:, -1:], mask.shape[1], ([], [])
        for s in range(steps):
            tok = torch.randint(4, 100, (len(prompts),), generator=gen)
            p = p + 1
            kv = full[:, : width + s + 1]
            ref = model(
                input_ids=tok[:, None],
                attention_mask=kv,
                position_ids=p,
                use_cache=True,
                past_key_values=caches[0],
            )
            got[0].append(ref.logits[:, -1])
            got[1].append(step(tok, p, kv.bool()[:, None, None, :], caches[1]))
    return torch.stack(got[0], 1), torch.stack(got[1], 1), caches


def test_direct_step_gives_the_forwards_logits_and_cache(tiny) -> None:
    model, tok = tiny
    ref, lean, caches = _decode_both(model, texts(tok), steps=6)
    assert torch.equal(ref, lean)
    for a, b in zip(caches[0].layers, caches[1].layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_direct_step_with_grouped_query_attention_and_bias() -> None:
    """Key/value heads shared by query heads (SmolLM2's layout) and biased projections."""
    config = tiny_config(101, num_key_value_heads=2, attention_bias=True, mlp_bias=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
    ref, lean, _ = _decode_both(model, prompts, steps=4)
    assert torch.allclose(ref, lean, atol=1e-6, rtol=0)


def test_generation_is_the_same_with_and_without_the_direct_step(tiny, monkeypatch) -> None:
    model, tok = tiny
    calls = []
    direct = LlamaDecodeStep.__call__
    monkeypatch.setattr(
        LlamaDecodeStep, "__call__", lambda self, *a: calls.append(1) or direct(self, *a)
    )
    params = SamplingParams(max_new_tokens=12, temperature=0.9, with_hidden=True)
    runs = []
    for lean in (True, False):
        engine = HFEngine(model, tok, generator=torch.Generator().manual_seed(3))
        engine.lean_decode = lean
        runs.append(engine.generate_with_cache(texts(tok) * 3, params))
    (a, kept_a), (b, kept_b) = runs
    assert len(calls) == 11  # the first run decoded through the direct step, the second not
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.logp, b.logp) and torch.equal(a.entropies, b.entropies)
    assert torch.equal(a.hidden, b.hidden)  # the LM head's hook (GAR) still fires
    for la, lb in zip(kept_a.caches[0].layers, kept_b.caches[0].layers, strict=True):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_the_forward_runs_where_the_step_cannot_reproduce_it(tiny) -> None:
    model, _ = tiny
    assert LlamaDecodeStep.of(model) is not None
    trained = copy.deepcopy(model).train()
    assert LlamaDecodeStep.of(trained) is None  # dropout
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    assert LlamaDecodeStep.of(eager) is None
    hooked = copy.deepcopy(model)
    hooked.model.layers[0].register_forward_hook(lambda *_: None)
    assert LlamaDecodeStep.of(hooked) is None
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"]))
    assert LlamaDecodeStep.of(peft) is None
