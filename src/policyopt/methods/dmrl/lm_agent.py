"""The frozen lower-level agent as a language model: document -> parameter values.

Any Hugging Face causal LM reads the skill document and a list of the parameters with their
ranges, and writes `name=value` pairs (greedy decoding). `parse_parameters` reads them:
each value is clipped into its range; a parameter the model did not write, or wrote
unreadably, keeps its default (`AdParams()`), and is counted in `last_missing`. Same
interface as the rule interpreter (`policyopt.tasks.skilldoc.rule_agent.LowerAgent`).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from policyopt.tasks.adsim.params import RANGES, AdParams
from policyopt.tasks.skilldoc.document import SkillDocument

_PAIR = re.compile(r"([a-z_]+)\s*[=:]\s*(-?\d+(?:\.\d+)?)")


def parse_parameters(text: str) -> tuple[AdParams, list[str]]:
    """(parameters, names missing from `text`) from `name=value` pairs, clipped to range."""
    found: dict[str, float] = {}
    for name, value in _PAIR.findall(text):
        if name in RANGES and name not in found:
            found[name] = float(value)
    missing = [n for n in RANGES if n not in found]
    return AdParams.clipped(found), missing


def agent_prompt(doc: SkillDocument) -> str:
    ranges = " ".join(f"{n}[{lo:g},{hi:g}]" for n, (lo, hi) in RANGES.items())
    return f"{doc.render()}\nset: {ranges}\nvalues:\n"


class LMAgent:
    """Greedy `name=value` generation by a causal LM (frozen, no grad)."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 120) -> None:
        self.model, self.tokenizer, self.max_new_tokens = model.eval(), tokenizer, max_new_tokens
        self.last_missing: list[str] = []

    @torch.no_grad()
    def __call__(self, doc: SkillDocument) -> AdParams:
        enc = self.tokenizer(agent_prompt(doc), return_tensors="pt", add_special_tokens=False)
        pad = self.tokenizer.pad_token_id
        out = self.model.generate(
            **enc,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=pad if pad is not None else self.tokenizer.eos_token_id,
        )
        text = self.tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        params, self.last_missing = parse_parameters(text)
        return params
