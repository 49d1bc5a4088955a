"""Decoding constrained to a grammar: a per-row mask of the tokens a grammar allows next.

`rollout.engine_options.grammar: NAME` (the `hf` engine) names a grammar in `GRAMMARS`: a
factory () -> `GrammarSource`, whose `ebnf(prompt_text)` is the grammar (xgrammar's EBNF) of
the completions of that prompt (a task's grammar may depend on its prompt: DMRL's edit
grammar lists the sections and rule numbers of the document in the prompt). `xgrammar`
compiles it against the tokenizer's vocabulary and tracks, per row, which tokens may come
next (`RowMatchers`, all rows in one xgrammar batch call per step); the engine masks the
other tokens' logits to -inf before sampling (`mask_logits`, xgrammar's bitmask kernel on
the packed words, no [B, V] bool mask).

The sampled policy is then the constrained one, π_c(y | s) = π(y | s) 1[y ∈ A(s)] / Z(s),
Z(s) = Σ_{v ∈ A(s)} π(v | s). Its log-probs are what the engine records, and the trainer
must recompute the same ones (log-softmax over the allowed tokens only), or the importance
ratio π_θ / π_old at the first update is Z(s) instead of 1, and the gradient misses the
−∇ log Z(s) term. So the rollouts carry the allowed sets (`Rollouts.allowed_bits`,
[N, R, ceil(V / 32)] int32 words, xgrammar's own bitmask: `core.token_bits`) and the log-prob
path masks with them (`models.logprobs`).

`xgrammar` is an optional dependency (the `dmrl` extra); it is imported only when a grammar
is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from policyopt.core.registry import Registry


class GrammarSource(Protocol):
    def ebnf(self, prompt_text: str) -> str:
        """The grammar (xgrammar EBNF, rule `root`) of the completions of `prompt_text`; the
        completion ends with the tokenizer's EOS once `root` is matched."""


# name -> factory() -> GrammarSource
GRAMMARS: Registry[Callable[[], GrammarSource]] = Registry("grammar")


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "rollout.engine_options.grammar needs the `xgrammar` package: "
            "pip install 'policyopt[dmrl]' (or pip install xgrammar)"
        ) from err
    return xgrammar


def vocabulary(tokenizer: Any) -> list[str]:
    """Each token id's text, in id order; special tokens (pad, BOS, EOS, unk...) as "" so
    that no grammar can match them as text (xgrammar treats empty tokens as special)."""
    special = set(tokenizer.all_special_ids)
    size = len(tokenizer)
    return [
        "" if i in special else tokenizer.convert_tokens_to_string([tok])
        for i, tok in enumerate(tokenizer.convert_ids_to_tokens(list(range(size))))
    ]


class GrammarConstraint:
    """A grammar source compiled against one tokenizer; compiled grammars are cached by text
    (a group's G rows, and consecutive steps on one document, share one compilation)."""

    def __init__(self, tokenizer: Any, source: GrammarSource, vocab_size: int) -> None:
        xgr = _xgrammar()
        self.tokenizer, self.source = tokenizer, source
        self.vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's)
        stop = [tokenizer.eos_token_id]
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop
        )
        if info.vocab_type == xgr.VocabType.RAW:  # e.g. the embedded character tokenizer:
            # its special tokens' texts ("<pad>") would otherwise be matchable text
            info = xgr.TokenizerInfo(
                vocabulary(tokenizer),
                vocab_type=xgr.VocabType.RAW,
                vocab_size=vocab_size,
                stop_token_ids=stop,
            )
        self._compiler = xgr.GrammarCompiler(info)
        self._compiled: dict[str, Any] = {}

    @staticmethod
    def of(name: str, tokenizer: Any, vocab_size: int) -> GrammarConstraint:
        # Grammars are registered by the tasks that define them (tasks/skilldoc/grammar.py),
        # imported with the task before an engine is built; rollout/ never imports tasks/.
        return GrammarConstraint(tokenizer, GRAMMARS.get(name)(), vocab_size)

    def compiled(self, ebnf: str) -> Any:
        if ebnf not in self._compiled:
            self._compiled[ebnf] = self._compiler.compile_grammar(ebnf)
        return self._compiled[ebnf]

    def start(self, prompts: list[list[int]]) -> RowMatchers:
        """One matcher per row, at the start of its completion of prompt `prompts[row]`."""
        texts = self.tokenizer.batch_decode(prompts, skip_special_tokens=True)
        return RowMatchers([self.compiled(self.source.ebnf(t)) for t in texts], self.vocab_size)


def mask_logits(logits: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """`logits` [B, V] as float32 with the tokens `bits` [B, ceil(V / 32)] (int32 words,
    `core.token_bits`) does not allow at -inf; `logits` itself is left as it was."""
    scores = logits.float()
    scores = scores.clone() if scores.data_ptr() == logits.data_ptr() else scores
    _xgrammar().apply_token_bitmask_inplace(scores, bits.to(scores.device))
    return scores


class RowMatchers:
    """Per-row grammar state during one decode: `allowed_bits` the next tokens, `accept` one.
    Both go through xgrammar's batch matcher: one call per step for all alive rows, not a
    Python loop over rows (the per-row loop cost +20% per generated token)."""

    def __init__(self, grammars: list[Any], vocab_size: int) -> None:
        xgr = _xgrammar()
        self.matchers = [xgr.GrammarMatcher(g) for g in grammars]
        self.vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
        # as many threads as torch uses here (a one-thread worker stays on one core)
        self._batch = xgr.BatchGrammarMatcher(max_threads=torch.get_num_threads())
        self._accept = xgr.BatchGrammarMatcher.batch_accept_token

    def allowed_bits(self, alive: torch.Tensor) -> torch.Tensor:
        """[n, ceil(V / 32)] int32 (`core.token_bits`): the tokens each alive row's grammar
        allows next; every token (-1) for the other rows (their samples are padding, masked
        out; a row that allows nothing would be NaN)."""
        out = torch.full(self._bitmask.shape, -1, dtype=torch.int32)
        rows = alive.nonzero().flatten().tolist()
        if rows:
            matchers = [self.matchers[row] for row in rows]
            self._batch.batch_fill_next_token_bitmask(matchers, self._bitmask, indices=rows)
            out[rows] = self._bitmask[rows]
        return out

    def accept(self, tokens: torch.Tensor, alive: torch.Tensor) -> None:
        rows = alive.nonzero().flatten().tolist()
        if not rows:
            return
        picked = [int(t) for t in tokens[rows].tolist()]
        accepted = self._accept([self.matchers[row] for row in rows], picked)
        for token, ok in zip(picked, accepted, strict=True):
            if not ok:
                raise RuntimeError(f"grammar rejected token {token} that its own mask allowed")
