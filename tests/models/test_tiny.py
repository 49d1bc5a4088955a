"""The embedded tiny model: character tokenizer, Hugging Face round trip, atomic cache."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from policyopt.models import tiny
from policyopt.models.tiny import build_char_tokenizer, build_tiny_model, tiny_model_path

SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
TEXTS = [
    "12 + 34 = 46",
    "  two leading spaces, two trailing  ",
    "line one\nline two\n\n\tindented\n",
    '<table><tr><td class="x">a &amp; b</td></tr></table>',
    r"$\frac{1}{2} + \sqrt{x^2} = \alpha_{i}$ \\ \begin{align} a &= b \end{align}",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trip_one_token_per_character(text: str) -> None:
    tok = build_char_tokenizer()
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no BOS/EOS added
    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids


def test_tokenizer_vocabulary() -> None:
    tok = build_char_tokenizer()
    assert len(tok) == 4 + 97  # specials + printable ASCII minus \x0b \x0c \r
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    assert tok.convert_ids_to_tokens([4, 13, 14]) == ["0", "9", "a"]
    assert tok("é\r")["input_ids"] == [3, 3]  # outside the alphabet -> <unk>
    assert tok.padding_side == "left"


def test_saved_model_and_tokenizer_load_with_auto_classes(tmp_path) -> None:
    build_tiny_model(tmp_path / "a", seed=3, **SMALL)
    build_tiny_model(tmp_path / "b", seed=3, **SMALL)
    build_tiny_model(tmp_path / "c", seed=4, **SMALL)
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert tok.decode(tok(TEXTS[2])["input_ids"]) == TEXTS[2]
    ids = torch.tensor([tok("7 * 8 = 56")["input_ids"]])
    logits = {k: AutoModelForCausalLM.from_pretrained(tmp_path / k)(ids).logits for k in "abc"}
    assert logits["a"].shape == (1, 10, 101)
    assert torch.equal(logits["a"], logits["b"])  # same seed -> identical weights on disk
    assert not torch.allclose(logits["a"], logits["c"])
    assert (tmp_path / "a" / "model.safetensors").is_file()


def test_build_does_not_disturb_global_rng(tmp_path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path, **SMALL)
    assert torch.equal(torch.rand(3), expected)


def test_cache_builds_once_with_default_config(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))
    path = tiny_model_path()
    assert path == tmp_path / "tiny-llama-v1"
    config = json.loads((path / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (
        128,
        4,
        4,
    )
    assert (config["intermediate_size"], config["max_position_embeddings"]) == (384, 512)
    assert config["tie_word_embeddings"] is False
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-llama-v1"]  # no temp dir left

    def must_not_build(*args, **kwargs):
        raise AssertionError("cache hit must not rebuild")

    monkeypatch.setattr(tiny, "build_tiny_model", must_not_build)
    assert tiny_model_path() == path


def test_killed_build_leaves_no_cache_entry(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))

    def dies_half_way(path, **kwargs):
        (path / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny, "build_tiny_model", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        tiny_model_path()
    assert list(tmp_path.iterdir()) == []


def test_concurrent_build_keeps_the_first_complete_copy(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))
    real_build = tiny.build_tiny_model
    final = tmp_path / "tiny-llama-v1"

    def other_process_wins(path, **kwargs):
        real_build(final, **SMALL)  # another build lands first...
        real_build(path, **SMALL)  # ...while ours is still writing

    monkeypatch.setattr(tiny, "build_tiny_model", other_process_wins)
    assert tiny_model_path() == final
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-llama-v1"]


def test_incomplete_cache_entry_is_an_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))
    (tmp_path / "tiny-llama-v1").mkdir()
    with pytest.raises(RuntimeError, match="incomplete.*model.safetensors"):
        tiny_model_path()


def test_sized_embedded_model_is_a_cached_llama_of_the_expected_size(tmp_path, monkeypatch) -> None:
    from transformers import LlamaForCausalLM

    from policyopt.models.loading import load_model

    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))
    model, tok = load_model("tiny-64x3")
    assert isinstance(model, LlamaForCausalLM)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 3, 2)
    assert cfg.intermediate_size == 192
    # Per layer: q, k, v, o (4 H^2), MLP (3 * H * 3H), two norms (2H); plus the input and
    # output embeddings (2 * 101 * H) and the final norm (H).
    h, v = 64, 101
    expected = 3 * (4 * h * h + 9 * h * h + 2 * h) + 2 * v * h + h
    assert sum(p.numel() for p in model.parameters()) == expected
    assert tok.decode(tok("T:19 N:4,7,9")["input_ids"]) == "T:19 N:4,7,9"
    path = tmp_path / "tiny-llama-v1-64x3"
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-llama-v1-64x3"]

    def must_not_build(*args, **kwargs):
        raise AssertionError("cache hit must not rebuild")

    monkeypatch.setattr(tiny, "build_tiny_model", must_not_build)
    assert tiny_model_path("tiny-64x3") == path


@pytest.mark.parametrize("name", ["tiny-100x2", "tiny-64x0", "tiny-4096x2"])
def test_sized_embedded_model_rejects_bad_sizes(name: str) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        tiny.embedded_size(name)


def test_other_names_are_not_embedded() -> None:
    assert tiny.embedded_size("tiny") == {}
    assert tiny.embedded_size("tiny-wide") is None
    assert tiny.embedded_size("HuggingFaceTB/SmolLM2-135M") is None


def test_positions_suffix_sets_max_positions_only(tmp_path, monkeypatch) -> None:
    """`tiny-128x4-p1024` is `tiny` with 1024 positions: the same weights and, under RoPE,
    the same logits, even past 512 positions (the DMRL editor's prompts)."""
    from policyopt.models.loading import load_model

    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))
    assert tiny.embedded_size("tiny-128x4-p1024")["max_position_embeddings"] == 1024
    assert "max_position_embeddings" not in tiny.embedded_size("tiny-128x4")
    with pytest.raises(ValueError, match="positions"):
        tiny.embedded_size("tiny-128x4-p8")
    base, _ = load_model("tiny")
    longer, tok = load_model("tiny-128x4-p1024")
    assert longer.config.max_position_embeddings == 1024 and tok.model_max_length == 1024
    ids = torch.tensor([tok("edit: " * 100, add_special_tokens=False)["input_ids"]])
    assert ids.shape[1] == 600
    with torch.no_grad():
        assert torch.equal(base(ids).logits, longer(ids).logits)
