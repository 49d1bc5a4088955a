"""The frozen lower-level agent as a language model: document -> parameter values.

Any Hugging Face causal LM reads the skill document and a list of the parameters with their
ranges, and writes `name=value` pairs (greedy decoding). `parse_parameters` reads them:
each value is clipped into its range; a parameter the model did not write, or wrote
unreadably, keeps its default (`AdParams()`), and is counted in `last_missing`. Same
interface as the rule interpreter (`policyopt.envs.ads.skilldoc.rule_agent.LowerAgent`).

Greedy decoding of a frozen model is a function of the document, so outputs are memoised
per rendered document. `stats()` gives the parse rate: the share of distinct documents
whose output named every whitelisted parameter, and the mean number named.

`grammar=True` constrains the decoding to `params_ebnf()`: one `name=value` line per
parameter, in `RANGES` order, each value a plain decimal (`rollout.grammar`, xgrammar). Every
output then parses and names all 14 (parse rate 1 by construction); what remains to measure
is whether the values follow the rules. The lab record (studies/record.md, issue 20) measured why it is needed: unconstrained,
SmolLM2-135M-Instruct continued the document's rule list and named no parameter.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from policyopt.envs.ads.adsim.params import RANGES, AdParams
from policyopt.envs.ads.skilldoc.document import SkillDocument
from policyopt.rollout.grammar import GrammarConstraint, RowMatchers, mask_logits

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
    return (
        f"{doc.render()}\nFollow the rules above. Write one name=value per parameter, "
        f"each within its range: {ranges}\nvalues:\n"
    )


# The output budget: 14 `name=value` lines are 134 SmolLM2 tokens at the defaults, 263
# characters with the char tokenizer.
LM_AGENT_TOKENS = 320
# at most two integer digits (the largest range ends at 12) and three decimals
_VALUE = '[0-9] [0-9]? ("." [0-9] [0-9]? [0-9]?)?'


def params_ebnf() -> str:
    """xgrammar EBNF of the agent's output under `grammar=True`: `name=value` for every
    parameter, one per line, in `RANGES` order."""
    lines = " ".join(f'"{name}=" value "\\n"' for name in RANGES)
    return f"root ::= {lines}\nvalue ::= {_VALUE}\n"


class _GrammarLogits(LogitsProcessor):
    """Masks each step's logits to what the grammar allows after the tokens generated so
    far (one row: the agent decodes one document at a time)."""

    def __init__(self, matchers: Any, prompt_len: int) -> None:
        self.matchers, self.prompt_len = matchers, prompt_len
        self.alive = torch.ones(1, dtype=torch.bool)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.prompt_len:  # the token chosen at the previous step
            self.matchers.accept(input_ids[:, -1], self.alive)
        return mask_logits(scores, self.matchers.allowed_bits(self.alive)).to(scores.dtype)


class LMAgent:
    """Greedy `name=value` generation by a causal LM (frozen, no grad)."""

    def __init__(
        self, model: Any, tokenizer: Any, max_new_tokens: int = 120, grammar: bool = False
    ) -> None:
        self.model, self.tokenizer, self.max_new_tokens = model.eval(), tokenizer, max_new_tokens
        self.model.requires_grad_(False)
        self.constraint: Any = None
        if grammar:
            width = model.get_output_embeddings().weight.shape[0]  # the logits' width
            self.constraint = GrammarConstraint(tokenizer, _FixedGrammar(), width)
        self.last_missing: list[str] = []
        self.outputs: dict[str, tuple[str, AdParams, list[str]]] = {}  # document -> output

    def stats(self) -> dict[str, float]:
        """Parse rate over the distinct documents seen (module docstring)."""
        n = len(self.outputs)
        missing = [len(m) for _, _, m in self.outputs.values()]
        return {
            "documents": float(n),
            "parse_rate": sum(m == 0 for m in missing) / n if n else float("nan"),
            "mean_named": sum(len(RANGES) - m for m in missing) / n if n else float("nan"),
        }

    def __call__(self, doc: SkillDocument) -> AdParams:
        key = doc.render()
        if key not in self.outputs:
            text = self.generate(doc)
            params, missing = parse_parameters(text)
            self.outputs[key] = (text, params, missing)
        _, params, self.last_missing = self.outputs[key]
        return params

    @torch.no_grad()
    def generate(self, doc: SkillDocument) -> str:
        """The model's greedy output for `doc` (the chat template when it has one)."""
        prompt = agent_prompt(doc)
        if getattr(self.tokenizer, "chat_template", None):
            prompt = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        enc = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        pad = self.tokenizer.pad_token_id
        extra: dict[str, Any] = {}
        if self.constraint is not None:
            grammar = self.constraint.compiled(params_ebnf())
            matchers = RowMatchers([grammar], self.constraint.vocab_size)
            processor = _GrammarLogits(matchers, enc["input_ids"].shape[1])
            # the grammar ends on the tokenizer's EOS: generation must stop there
            extra = {
                "logits_processor": LogitsProcessorList([processor]),
                "eos_token_id": self.tokenizer.eos_token_id,
            }
        out = self.model.generate(
            **enc,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=pad if pad is not None else self.tokenizer.eos_token_id,
            **extra,
        )
        return self.tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


class _FixedGrammar:
    """`rollout.grammar.GrammarSource` of `params_ebnf()`, whatever the prompt."""

    def ebnf(self, prompt_text: str) -> str:
        return params_ebnf()
