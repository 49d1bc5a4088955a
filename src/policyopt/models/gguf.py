"""GGUF models, converted once to a plain safetensors folder in the model cache.

transformers reads a GGUF file by de-quantising every tensor and converting its tokenizer
on each load (SmolLM2-135M-Instruct: 19 s here, against 0.2 s for the same model saved as a
folder). `gguf_folder` does that once and caches the result: float32 weights (de-quantised
Q4_1 values are not exact in bfloat16) and the tokenizer, keyed by the file's path, size and
modification time and the transformers version, so a changed file or a new converter makes
a new entry. The GGUF-quantized marks transformers leaves on the model are dropped: nothing
quantized remains, and with them it refuses to save (the SFT cache, merged checkpoints).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from policyopt.models.cache import build_once, cache_dir

ENTRY_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def gguf_folder(gguf: Path) -> Path:
    """The cached plain folder of the GGUF model file `gguf`, converted on first use."""
    gguf = gguf.expanduser().resolve()
    stat = gguf.stat()
    identity = f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return build_once(
        cache_dir() / "gguf" / f"{gguf.stem}-{key}", lambda tmp: _convert(gguf, tmp), ENTRY_FILES
    )


def _convert(gguf: Path, out: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, trust_remote_code=False
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False
    ).save_pretrained(out)
