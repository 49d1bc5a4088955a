"""What a rollout engine returns, and the interface every engine implements.

Engines sample G responses per prompt and record, per response token, the sampling
log-prob and the entropy of the sampling distribution (HISPO builds its segments and DATPO
its forks from these, at rollout time).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from policyopt.core.registry import Registry

# on_finished(row, token_ids): a response ended (EOS), before `generate` returns; `row` is
# its index in the prompts given to `generate`, `token_ids` the response with its EOS.
FinishedFn = Callable[[int, list[int]], None]

# name -> factory(model, tokenizer, **options) -> RolloutEngine
ENGINES: Registry[Callable[..., RolloutEngine]] = Registry("rollout engine")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `greedy` ignores temperature and top-p."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    # Capture the hidden state entering the LM head for every generated token (GAR). An
    # engine that cannot (vllm without its trainer pass) leaves `Rollouts.hidden` None, and
    # GAR's shaper runs the trainer's trunk over the rollouts it needs instead.
    with_hidden: bool = False


@dataclass
class Rollouts:
    """A batch of sampled responses, one row per response.

    Layout: `prompt_ids` is left-padded [N, P]; `response_ids` right-padded [N, R]. The EOS
    token that ends a response is part of it (mask 1); positions after it are padding.
    A multi-turn rollout (`policyopt.rollout.multiturn`) also holds the environment's tokens
    between the model's turns, with mask 0: the policy reads them (`attention_mask`,
    `lengths`, the decoded text) but is never trained on them. Only the zeros after a row's
    last generated token are padding (`response_span`).
    """

    prompt_ids: torch.Tensor  # [N, P] long
    prompt_mask: torch.Tensor  # [N, P] long (1 = token)
    response_ids: torch.Tensor  # [N, R] long
    response_mask: torch.Tensor  # [N, R] float (1 = generated token)
    logp: torch.Tensor  # [N, R] sampling log-probs (temperature-scaled distribution)
    entropies: torch.Tensor  # [N, R] entropy of the sampling distribution
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens without EOS
    # Tokens the engine actually generated (a tree counts a shared prefix once).
    generated_tokens: int
    hidden: torch.Tensor | None = None  # [N, R, d] if SamplingParams.with_hidden (see there)
    # Declared structure (policyopt.core.structure) for later parts of the step: each value
    # is [N] per rollout, [N, R] per token (block ids, segment ids) or [N, N] pairwise.
    structure: dict[str, torch.Tensor] = field(default_factory=dict)
    # The names in `structure` that are pairwise [N, N] (R may equal N, so shape cannot tell).
    pairwise: frozenset[str] = frozenset()
    # False when the engine could not compute `entropy` (vLLM returns no full distribution:
    # rollout/vllm_engine.py); `entropy` then holds zeros, and what reads it must refuse.
    has_entropies: bool = True
    # [N, R, ceil(V / 32)] int32, packed (`core.token_bits`): the tokens a grammar allowed at
    # each response position (constrained decoding, `rollout.grammar`); `logp` is then the
    # constrained distribution's and the trainer recomputes it over the same tokens.
    # None: unconstrained.
    allowed_bits: torch.Tensor | None = None
    # [N, R] long: a ranking policy's placed items as indices into its row's candidates (the
    # prompt without its left padding), -1 past the ranking's end; recorded by the `pl`
    # engine, which knows what it sampled, so that nothing has to look the ids up again
    # (SRPO's `ranking_distances`). None: not a ranking engine's rollouts.
    item_columns: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """Tokens of each response through its last generated one (environment tokens between
        turns included); the generated tokens alone are `response_mask.sum(-1)`."""
        return response_span(self.response_mask).sum(-1)

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, response_span(self.response_mask)], dim=1)

    def select(self, index: torch.Tensor) -> Rollouts:
        """Rows `index` (a long index or bool mask); token counts stay those generated."""
        pick: Callable[[Any], Any] = lambda t: None if t is None else t[index]  # noqa: E731
        return replace(
            self,
            prompt_ids=self.prompt_ids[index],
            prompt_mask=self.prompt_mask[index],
            response_ids=self.response_ids[index],
            response_mask=self.response_mask[index],
            logp=self.logp[index],
            entropies=self.entropies[index],
            truncated=self.truncated[index],
            hidden=pick(self.hidden),
            allowed_bits=pick(self.allowed_bits),
            item_columns=pick(self.item_columns),
            structure={
                k: select_structure(v, index, k in self.pairwise) for k, v in self.structure.items()
            },
        )

    def with_structure(self, values: dict[str, torch.Tensor], pairwise: bool = False) -> Rollouts:
        """These rollouts with structure added (each value's first dim N; `pairwise` marks
        them [N, N]). A new object: copies made before keep the structure they had."""
        for name, value in values.items():
            if pairwise and (value.dim() != 2 or value.shape[1] != value.shape[0]):
                raise ValueError(
                    f"pairwise structure {name!r} must be [N, N], got {tuple(value.shape)}"
                )
        names = set(values)
        return replace(
            self,
            structure={**self.structure, **values},
            pairwise=(self.pairwise | names) if pairwise else (self.pairwise - names),
        )


def response_span(response_mask: torch.Tensor) -> torch.Tensor:
    """[N, R] long: 1 from a response's first position through its last generated token.

    Equal to `response_mask` for a response sampled in one piece; in a multi-turn rollout it
    is also 1 on the environment's tokens between the model's turns (mask 0 there), which the
    policy reads but does not sample. The zeros after the last generated token are padding."""
    return (response_mask.flip(-1).cummax(-1).values.flip(-1) > 0).long()


def select_structure(value: torch.Tensor, index: torch.Tensor, pairwise: bool) -> torch.Tensor:
    """Rows `index` of a structure value; a pairwise [N, N] one is indexed in both dims."""
    picked = value[index]
    return picked[:, index] if pairwise else picked


def concat_structure(
    parts: list[Rollouts], width: int
) -> tuple[dict[str, torch.Tensor], frozenset[str]]:
    """Structure of stacked rollouts: [N] values concatenated, [N, R] ones right-padded with 0
    to `width`, pairwise [N, N] ones block-diagonal (0 between parts: rollouts of different
    parts are of different groups, whose entries are never read)."""
    keys, pairwise = set(parts[0].structure), parts[0].pairwise
    for r in parts[1:]:
        if set(r.structure) != keys or r.pairwise != pairwise:
            raise ValueError(
                "cannot concatenate rollouts with different structure: "
                f"{sorted(keys)} (pairwise {sorted(pairwise)}) and {sorted(r.structure)} "
                f"(pairwise {sorted(r.pairwise)})"
            )
    out = {}
    for k in sorted(keys):
        values = [r.structure[k] for r in parts]
        if k in pairwise:
            out[k] = torch.block_diag(*values)
        elif values[0].dim() == 1:
            out[k] = torch.cat(values)
        else:
            out[k] = torch.cat(
                [torch.nn.functional.pad(v, (0, width - v.shape[1]), value=0) for v in values]
            )
    return out, pairwise


def concat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """Stack rollouts of different widths (prompts re-padded left, responses right)."""
    if len(parts) == 1:
        return parts[0]
    p = max(r.prompt_ids.shape[1] for r in parts)
    t = max(r.response_ids.shape[1] for r in parts)

    def left(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        pad = (0, 0, 0, width - x.shape[1]) if x.dim() == 3 else (0, width - x.shape[1])
        return torch.nn.functional.pad(x, pad, value=value)

    hidden = None
    if all(r.hidden is not None for r in parts):
        hidden = torch.cat([right(r.hidden, t, 0.0) for r in parts])
    structure, pairwise = concat_structure(parts, t)
    allowed_bits = None
    if any(r.allowed_bits is not None for r in parts):
        # unconstrained parts, and padding, allow every token (only masked positions)
        words = next(r.allowed_bits.shape[-1] for r in parts if r.allowed_bits is not None)
        allowed_bits = torch.cat([_bits_or_all(r, words, t) for r in parts])
    item_columns = None
    if all(r.item_columns is not None for r in parts):
        item_columns = torch.cat([right(r.item_columns, t, -1) for r in parts])
    return Rollouts(
        prompt_ids=torch.cat([left(r.prompt_ids, p, pad_id) for r in parts]),
        prompt_mask=torch.cat([left(r.prompt_mask, p, 0) for r in parts]),
        response_ids=torch.cat([right(r.response_ids, t, pad_id) for r in parts]),
        response_mask=torch.cat([right(r.response_mask, t, 0.0) for r in parts]),
        logp=torch.cat([right(r.logp, t, 0.0) for r in parts]),
        entropies=torch.cat([right(r.entropies, t, 0.0) for r in parts]),
        truncated=torch.cat([r.truncated for r in parts]),
        generated_tokens=sum(r.generated_tokens for r in parts),
        hidden=hidden,
        structure=structure,
        pairwise=pairwise,
        has_entropies=all(r.has_entropies for r in parts),
        allowed_bits=allowed_bits,
        item_columns=item_columns,
    )


def _bits_or_all(r: Rollouts, words: int, width: int) -> torch.Tensor:
    """`r.allowed_bits` right-padded to `width` with every-token (-1) words (all when None)."""
    out = torch.full((len(r), width, words), -1, dtype=torch.int32)
    if r.allowed_bits is not None:
        out[:, : r.allowed_bits.shape[1]] = r.allowed_bits
    return out


class MissingEntropyError(ValueError):
    """Rollout-time entropies were asked for but the engine did not compute them."""


def require_entropies(rollouts: Rollouts, who: str) -> None:
    """Raise `MissingEntropyError` naming `who` if `rollouts` have no entropies."""
    if not rollouts.has_entropies:
        raise MissingEntropyError(
            f"{who} needs the rollout-time token entropies, which this rollout engine did not "
            "compute: with rollout.engine=vllm set rollout.engine_options.entropies=trainer "
            "(one no-grad forward of the trainer's model per batch), or use rollout.engine=hf"
        )


class RolloutEngine(ABC):
    """Samples responses for tokenised prompts."""

    # Whether the sampling log-probs are the trainer's own (same model, same kernels): if
    # not, algorithm.tis_cap="auto" corrects the difference by truncated importance sampling.
    exact_logprobs: bool = True
    # Optional capabilities, declared here so that strategies ask instead of probing.
    # tree_rollouts: branches from shared prefixes (`policyopt.rollout.tree`: the engine has
    # `model`, `decode` and `generate_with_cache`, which keeps the KV cache of its samples).
    tree_rollouts: bool = False
    # prefix_continuations: `continue_prefixes` samples from given token prefixes in one call
    # (the vllm engine: continuation requests that find the prefix in vLLM's prefix cache);
    # DATPO's tree grows its branches that way on an engine without `tree_rollouts`.
    prefix_continuations: bool = False
    # prefix_cache: those continuations find their prefix's KV cached instead of recomputing
    # it (vLLM's automatic prefix caching on).
    prefix_cache: bool = False
    # The tokenizer, for strategies that read text (DATPO's sentence forks); None: ids only.
    tokenizer: Any = None
    pad_id: int = 0

    def generate_with_cache(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[Rollouts, Any]:
        """`generate`, also returning the KV cache of the samples (`tree_rollouts` only)."""
        raise NotImplementedError(
            f"{type(self).__name__} keeps no KV cache of its samples (tree_rollouts is False)"
        )

    def continue_prefixes(
        self,
        prefixes: list[list[int]],
        budgets: list[int],
        branches: list[int],
        params: SamplingParams,
    ) -> Rollouts:
        """`branches[j]` continuations of token prefix `prefixes[j]` (a prompt and the part of
        a response before a fork), at most `budgets[j]` tokens each, rows ordered prefix by
        prefix (none for 0 branches): `prompt_ids` are the prefixes, the responses the
        continuations, and `generated_tokens` counts continuation tokens only
        (`prefix_continuations` only; `policyopt.rollout.tree.sample_branches` is the same
        contract on the hf engine)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not continue prefixes (prefix_continuations is False)"
        )

    @abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        on_finished: FinishedFn | None = None,
    ) -> Rollouts:
        """One response per entry of `prompts` (repeat a prompt G times for a group).

        `on_finished` is told of each response that ends with EOS as soon as it ends, so that
        slow rewards can start while longer responses are still being sampled. It is a hint:
        an engine that cannot stream may call it late or not at all, and the returned
        rollouts are what count."""

    def sync_weights(self) -> None:  # noqa: B027 - engines sharing the policy need nothing
        """Called after each optimizer step; engines holding their own copy reload it."""
