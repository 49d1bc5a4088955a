"""The embedded tiny model: a character tokenizer and a small Llama, in Hugging Face format.

The project's default policy runs end to end on a laptop CPU, so it is built here rather than
downloaded: `build_tiny_model` writes a randomly initialised (fixed seed) `LlamaForCausalLM`
and its tokenizer with `save_pretrained`, and `tiny_model_path` caches one such build.

Sizes by name: `tiny` is the default (hidden 128, 4 layers, 0.88 M parameters); `tiny-HxL` is
the same architecture with hidden size H (a multiple of 32: heads of 32 dimensions, MLP 3H)
and L layers, e.g. `tiny-256x6`, for tasks the default is too small for (the Countdown
recipe); `tiny-HxL-pN` also sets the positions (`max_position_embeddings`, default 512) to N,
for prompts longer than 512 characters (the DMRL editor's: `tiny-128x4-p1024` is `tiny`,
same weights, with 1024 positions). Each size is built once and cached under its own name.

The tokenizer maps every printable ASCII character (digits, operators, letters, HTML and
LaTeX punctuation, space, tab, newline) to exactly one token, so `decode(encode(s)) == s` for
any text made of them; other characters become `<unk>`. No BOS/EOS is added automatically.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from policyopt.models.cache import build_once, cache_dir

TINY_MODEL_NAME = "tiny-llama-v1"
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0, 1, 2, 3
# string.printable minus vertical tab, form feed and carriage return: 97 characters.
CHARACTERS = tuple(c for c in string.printable if c not in "\x0b\x0c\r")

TINY_CONFIG_DEFAULTS: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 384,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


EMBEDDED_SIZE = re.compile(r"tiny-(\d+)x(\d+)(?:-p(\d+))?")


def embedded_size(name: str) -> dict[str, Any] | None:
    """The config overrides of an embedded model name: `{}` for `tiny`, hidden size, heads,
    MLP width and layers for `tiny-HxL`, and positions for `tiny-HxL-pN`; None when `name`
    is not an embedded model."""
    if name == "tiny":
        return {}
    match = EMBEDDED_SIZE.fullmatch(name)
    if match is None:
        return None
    hidden, layers = int(match.group(1)), int(match.group(2))
    if hidden % 32 or not 32 <= hidden <= 2048 or not 1 <= layers <= 48:
        raise ValueError(
            f"embedded model {name!r}: tiny-HxL needs a hidden size H that is a multiple of 32 "
            f"in 32-2048 and 1-48 layers L (e.g. tiny-256x6)"
        )
    sizes = {
        "hidden_size": hidden,
        "num_attention_heads": hidden // 32,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers,
    }
    if match.group(3) is not None:
        n = int(match.group(3))
        if not 16 <= n <= 32768:
            raise ValueError(f"embedded model {name!r}: -pN needs 16 <= N <= 32768 positions")
        sizes["max_position_embeddings"] = n
    return sizes


def build_char_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """The character-level tokenizer: specials first, then one token per character."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    # BPE with no merges over an unsplit string yields exactly one token per character;
    # Fuse() decodes by plain concatenation (no spaces inserted between tokens).
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def tiny_config(vocab_size: int, **overrides: Any) -> LlamaConfig:
    """The tiny Llama config with the project's defaults, updated by `overrides`."""
    values = {**TINY_CONFIG_DEFAULTS, **overrides}
    return LlamaConfig(
        vocab_size=vocab_size,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **values,
    )


def build_tiny_model(path: str | Path, *, seed: int = 0, **config_overrides: Any) -> Path:
    """Initialise the tiny model with `seed` and save model + tokenizer to `path`.

    `config_overrides` are `LlamaConfig` fields (e.g. `hidden_size=64`). The result loads with
    `AutoModelForCausalLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)`.
    """
    path = Path(path)
    config = tiny_config(len(SPECIAL_TOKENS) + len(CHARACTERS), **config_overrides)
    tokenizer = build_char_tokenizer(config.max_position_embeddings)
    # fork_rng: seeding here must not change the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def tiny_model_path(name: str = "tiny") -> Path:
    """The cached embedded model `name` (`tiny` or `tiny-HxL`, see `embedded_size`), built on
    first use (atomically: `policyopt.models.cache.build_once`)."""
    overrides = embedded_size(name)
    if overrides is None:
        raise ValueError(
            f"{name!r} is not an embedded model; valid: tiny, tiny-HxL (e.g. tiny-256x6)"
        )
    entry = TINY_MODEL_NAME if name == "tiny" else f"{TINY_MODEL_NAME}-{name.removeprefix('tiny-')}"
    return build_once(
        cache_dir() / entry,
        lambda tmp: build_tiny_model(tmp, **overrides),
        ("config.json", "model.safetensors", "tokenizer.json"),
    )
