"""Batched sampling with the model's KV cache, on any Hugging Face causal LM.

One forward per new token for the batch, until every row is done or `max_new_tokens` is
reached. Rows that reached EOS leave the model's batch (their KV cache rows dropped) once a
quarter of it has ended (`decode`), so that the short answers of a trained policy do not pay
for the longest one: on the quickstart's SFT model, 16 x 8 samples of up to 48 tokens,
sampling took 0.15 s instead of 0.25 s per step (studies/record.md). Where the caller reads
the cache or one hidden state per row and step afterwards, every row stays to the end,
feeding padding (masked out); `compact_decode=False` does that always.

On a small model the decode loop is overhead-bound rather than compute-bound, so two things
are done once instead of per token or per row: a group's G copies of a prompt share one
prefill (its KV cache is copied G times, as tree rollouts do for a fork's prefix), and the KV
cache lives in buffers sized for the whole response (`transformers`' `DynamicLayer` grows by
`torch.cat`, copying the whole cache at every token).

`generate_with_cache` also returns the KV caches the sampling left behind (`KeptCache`): row
r's cache holds its prompt and every response token but the last, so a continuation from any
position of the response (DATPO's forks, `policyopt.rollout.tree`) starts from it without
running the prefix through the model again.

`grammar` (`rollout.engine_options.grammar`, a name in `rollout.grammar.GRAMMARS`) constrains
every row's completion to a grammar of its prompt: the disallowed tokens' logits are -inf
before sampling, and the rollouts carry the allowed sets so that the trainer's log-probs are
the constrained distribution's too (`rollout/grammar.py`). A constrained engine offers no
tree rollouts (a fork would need the grammar state at its position).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

try:  # transformers >= 4.56 keeps the cache as one object per layer
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - older transformers: the cache grows by torch.cat
    DynamicLayer = None

from policyopt.models.logprobs import cache_kwarg, trunk_of
from policyopt.models.precision import (
    frozen_linears_in_bf16,
    head_logits,
    is_mixed,
    mixed_precision,
)
from policyopt.rollout.base import (
    ENGINES,
    FinishedFn,
    RolloutEngine,
    Rollouts,
    SamplingParams,
    concat_rollouts,
)
from policyopt.rollout.grammar import GrammarConstraint, RowMatchers, mask_logits
from policyopt.rollout.llama_step import LlamaDecodeStep
from policyopt.rollout.sampling import sample_next


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (ids [B, P], mask [B, P])."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        if p:
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding: 0 at each row's first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _cache_of(out: object) -> object:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values  # type: ignore[attr-defined]


@ENGINES.register("hf")
class HFEngine(RolloutEngine):
    """Sampling loop over `model.forward` with `past_key_values`."""

    tree_rollouts = True  # generate_with_cache, decode (rollout/tree.py)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 256,
        generator: torch.Generator | None = None,
        lean_decode: bool = True,
        compact_decode: bool = True,
        grammar: str | None = None,
    ) -> None:
        self.model = model
        self.grammar = None
        if grammar is not None:
            vocab = model.get_output_embeddings().weight.shape[0]
            self.grammar = GrammarConstraint.of(grammar, tokenizer, vocab)
            self.tree_rollouts = False
        # Decode a Llama model through its modules, not its forward (same logits; `llama_step`).
        self.lean_decode = lean_decode
        # Drop ended rows from the decode batch (`decode`); off: every row to the end.
        self.compact_decode = compact_decode
        self.tokenizer = tokenizer  # strategies that read text (DATPO's sentence forks)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.batch_size = batch_size
        self.generator = generator
        self.cache_keyword = cache_kwarg(model)  # the forward's name for its KV cache

    @property
    def exact_logprobs(self) -> bool:  # type: ignore[override]
        """Whether the sampling log-probs are the trainer's own: not under bf16-mixed, where
        decoding one token at a time rounds differently in bfloat16 from the trainer's
        forward over the whole sequence (`models.precision`)."""
        return not is_mixed(self.model)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        on_finished: FinishedFn | None = None,
    ) -> Rollouts:
        return self._generate(prompts, params, on_finished, keep_cache=False)[0]

    @torch.no_grad()
    def generate_with_cache(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[Rollouts, KeptCache]:
        """`generate`, and the KV caches the sampling filled (module docstring)."""
        rollouts, parts = self._generate(prompts, params, None, keep_cache=True)
        return rollouts, KeptCache(
            caches=[cache for _, cache, _ in parts],
            widths=[width for _, _, width in parts],
            starts=[i * self.batch_size for i in range(len(parts))],
            prompt_lengths=[len(p) for p in prompts],
        )

    def _generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        on_finished: FinishedFn | None,
        keep_cache: bool,
    ) -> tuple[Rollouts, list[tuple[Rollouts, object, int]]]:
        if not prompts:
            raise ValueError("generate() got no prompts")
        parts = [
            self._generate_batch(
                prompts[i : i + self.batch_size], params, _shifted(on_finished, i), keep_cache
            )
            for i in range(0, len(prompts), self.batch_size)
        ]
        return concat_rollouts([r for r, _, _ in parts], self.pad_id), parts

    def _generate_batch(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        on_finished: FinishedFn | None,
        keep_cache: bool,
    ) -> tuple[Rollouts, object, int]:
        was_training = self.model.training
        self.model.eval()
        try:
            with self.precision():
                return self._sample(prompts, params, on_finished, keep_cache)
        finally:
            self.model.train(was_training)

    def precision(self) -> AbstractContextManager[object]:
        """The context the model's forwards run in (`models.precision`): under bf16-mixed,
        bfloat16 autocast, with frozen linear weights (LoRA's base layers) cast to bfloat16
        once for the whole of it rather than at every token; nothing under fp32. Entered
        again inside, it changes nothing."""
        stack = ExitStack()
        stack.enter_context(mixed_precision(self.model))
        head = self.model.get_output_embeddings()
        stack.enter_context(frozen_linears_in_bf16(self.model, skip=head))
        return stack

    def _last_logits(self, **inputs: object) -> tuple[torch.Tensor, object]:
        """(logits [n, V] of each row's last position, KV cache) of one forward. Under
        bf16-mixed the trunk runs under the caller's autocast and the LM head outside it, in
        float32 (`models.precision.head_logits`), as in the trainer's log-probs."""
        if not is_mixed(self.model):
            out = self.model(**inputs, logits_to_keep=1)
            return out.logits[:, -1], _cache_of(out)
        trunk = trunk_of(self.model)
        cache = inputs.pop(self.cache_keyword, None)
        if cache is not None:
            inputs[cache_kwarg(trunk)] = cache
        out = trunk(**inputs)
        head = self.model.get_output_embeddings()
        # [n, 1, d] into the head, so that its hooks (`head_inputs`) see the usual shape
        return head_logits(head, out.last_hidden_state[:, -1:])[:, -1], _cache_of(out)

    def _sample(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        on_finished: FinishedFn | None,
        keep_cache: bool,
    ) -> tuple[Rollouts, object, int]:
        """(rollouts, the KV cache decoding left behind, the left-padded prompt width)."""
        # Identical prompts (a group's G copies) are prefilled once; row r continues unique
        # prompt `copy[r]`, from a copy of its KV cache and last logits.
        unique: dict[tuple[int, ...], int] = {}
        copy = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p in prompts])
        prefix_ids, prefix_mask = left_pad([list(p) for p in unique], self.pad_id)
        device = next(self.model.parameters()).device
        ids, mask = prefix_ids.to(device), prefix_mask.to(device)
        pos = positions(mask)
        on_device = copy.to(device)
        with head_inputs(self.model, params.with_hidden) as hidden_steps:
            logits, cache = self._last_logits(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True
            )
            if len(unique) < len(prompts):
                cache.batch_select_indices(on_device)  # type: ignore[attr-defined]
            if hidden_steps:
                hidden_steps[0] = hidden_steps[0][on_device]
            budget = torch.full((len(prompts),), params.max_new_tokens)
            decoded = self.decode(
                cache,
                logits[on_device],
                mask[on_device],
                pos[on_device, -1:],
                budget,
                params,
                on_finished,
                matchers=None if self.grammar is None else self.grammar.start(prompts),
                keep_cache=keep_cache,
            )
        rollouts = to_rollouts(prefix_ids[copy], prefix_mask[copy], decoded, hidden_steps)
        return rollouts, decoded.cache, prefix_ids.shape[1]

    def decode(
        self,
        cache: object,
        logits: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        budget: torch.Tensor,
        params: SamplingParams,
        on_finished: FinishedFn | None = None,
        matchers: RowMatchers | None = None,
        keep_cache: bool = False,
    ) -> Decoded:
        """Sample from `logits` [n, V] (the prefill's last position) on, one forward per token
        with the KV `cache`, until every row hit EOS or its token `budget` [n]. `mask` is the
        attention mask so far and `pos` [n, 1] each row's last position id; `on_finished`
        (`RolloutEngine.generate`) hears of each row as it samples its EOS; `matchers` (a
        grammar's per-row state, module docstring) constrain each row's tokens.

        Rows that ended leave the model's batch once at most `COMPACT_AT` of it still
        decodes (their KV cache rows dropped), so a batch whose responses end early stops
        paying for them; `Decoded.cache` is then None. `keep_cache` (the caller reads the
        cache afterwards: `generate_with_cache`, which tree forks start from), hidden-state
        capture (`params.with_hidden`, one entry
        per row and step) and `compact_decode=False` keep every row to the end.

        The forwards run in the model's precision (`precision`), also when a tree strategy
        calls this directly."""
        with self.precision():
            return self._decode(
                cache, logits, mask, pos, budget, params, on_finished, matchers, keep_cache
            )

    def _decode(
        self,
        cache: object,
        logits: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        budget: torch.Tensor,
        params: SamplingParams,
        on_finished: FinishedFn | None,
        matchers: RowMatchers | None,
        keep_cache: bool,
    ) -> Decoded:
        device = logits.device
        budget = budget.to(device)
        steps = int(budget.max())
        cache = preallocate(cache, steps)
        n = logits.shape[0]
        compact = (
            self.compact_decode
            and not keep_cache
            and not params.with_hidden
            and _compactable(cache)
        )
        batch_rows: torch.Tensor | None = (
            None  # which of the n rows the model still runs; None: all
        )
        # The attention mask of every step is a prefix of this one: each step attends to
        # one more position (rows past EOS too: their padding outputs are masked later).
        width = mask.shape[1]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], steps)], dim=1)
        # A Llama model with a preallocated cache decodes through its modules directly
        # (`llama_step`), with the 4-D attention mask built here once.
        lean = self._lean_step(cache)
        mask4 = mask.bool()[:, None, None, :] if lean is not None else None
        alive = torch.ones(logits.shape[0], dtype=torch.bool, device=device)
        finished = torch.zeros_like(alive)
        tokens, logps, ents, alive_steps, allowed_steps = [], [], [], [], []
        for step in range(steps):
            alive = alive & (step < budget)
            if matchers is not None:
                bits = matchers.allowed_bits(alive.cpu())
                allowed_steps.append(bits)
                logits = mask_logits(logits, bits if batch_rows is None else bits[batch_rows.cpu()])
            tok, lp, ent = sample_next(
                logits,
                temperature=params.temperature,
                top_p=params.top_p,
                greedy=params.greedy,
                generator=self.generator,
            )
            if batch_rows is not None:  # back to all n rows; those out of the batch ended
                tok, lp, ent = (_scattered(x, batch_rows, n) for x in (tok, lp, ent))
            tok = tok.masked_fill(~alive, self.pad_id)
            if matchers is not None:
                matchers.accept(tok.cpu(), alive.cpu())
            tokens.append(tok)
            logps.append(lp)
            ents.append(ent)
            alive_steps.append(alive)
            ended = tok == self.eos_id
            if on_finished is not None and (alive & ended).any():
                ended_rows = (alive & ended).nonzero().flatten()
                for row, ids in zip(
                    ended_rows.tolist(), torch.stack(tokens, 1)[ended_rows].tolist(), strict=True
                ):
                    on_finished(row, ids)
            finished = finished | (alive & ended)
            alive = alive & ~ended
            if not (alive & (step + 1 < budget)).any():
                break
            pos = pos + 1
            if compact:
                # Rows that decode on: alive, with budget left (the others' outputs are
                # masked anyway). Copying the cache costs about one step, hence the margin.
                going = alive & (step + 1 < budget)
                in_batch = going if batch_rows is None else going[batch_rows]
                if int(in_batch.sum()) <= COMPACT_AT * in_batch.numel():
                    keep = in_batch.nonzero().flatten()
                    cache.batch_select_indices(keep)  # type: ignore[attr-defined]
                    batch_rows = keep if batch_rows is None else batch_rows[keep]
                    pos, mask = pos[keep], mask[keep]
                    mask4 = None if mask4 is None else mask4[keep]
            batch_tok = tok if batch_rows is None else tok[batch_rows]
            if lean is not None:
                logits = lean(batch_tok, pos, mask4[..., : width + step + 1], cache)
                continue
            logits, cache = self._last_logits(
                input_ids=batch_tok[:, None],
                attention_mask=mask[:, : width + step + 1],
                position_ids=pos,
                use_cache=True,
                **{self.cache_keyword: cache},
            )
        return Decoded(
            tokens=torch.stack(tokens, 1),
            logp=torch.stack(logps, 1),
            entropies=torch.stack(ents, 1),
            mask=torch.stack(alive_steps, 1).float(),
            finished=finished,
            cache=cache if batch_rows is None else None,
            allowed_bits=torch.stack(allowed_steps, 1) if allowed_steps else None,
        )

    def _lean_step(self, cache: object) -> LlamaDecodeStep | None:
        """The direct decode step, where the model and the cache allow it (`llama_step`) and
        `lean_decode` is on."""
        layers = getattr(cache, "layers", None)
        if DynamicLayer is None or not self.lean_decode or not layers:
            return None
        if any(type(layer) is not PreallocatedLayer for layer in layers):
            return None
        return LlamaDecodeStep.of(self.model)


# Drop ended rows from the decode batch once at most this share of it still decodes.
COMPACT_AT = 0.75


def _compactable(cache: object) -> bool:
    """Whether rows can be dropped from `cache` by `batch_select_indices`: layers that keep
    every position (the preallocated ones `decode` makes, or plain dynamic ones)."""
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not layers:
        return False
    return all(type(layer) in (DynamicLayer, PreallocatedLayer) for layer in layers)


def _scattered(x: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """`x` [len(rows)] of the batch's rows placed at `rows` of an [n] tensor of zeros."""
    return x.new_zeros(n).index_copy_(0, rows, x)


def _shifted(on_finished: FinishedFn | None, offset: int) -> FinishedFn | None:
    """`on_finished` for a chunk of the prompts that starts at `offset`."""
    if on_finished is None or offset == 0:
        return on_finished
    return lambda row, token_ids: on_finished(row + offset, token_ids)


@dataclass
class Decoded:
    """What `HFEngine.decode` sampled: [n, steps] tensors, `finished` [n] (ended by EOS), and
    the KV cache: the prefix and every sampled token but the last (never fed back)."""

    tokens: torch.Tensor
    logp: torch.Tensor
    entropies: torch.Tensor
    mask: torch.Tensor
    finished: torch.Tensor
    cache: object = None
    allowed_bits: torch.Tensor | None = None  # [n, steps, ceil(V/32)] int32, a grammar's (CPU)


@dataclass
class KeptCache:
    """The KV caches of one `generate_with_cache` call, one per engine batch (chunk).

    Row r (of the call's prompts) is row r − starts[c] of chunk c's cache, whose first
    widths[c] columns are the chunk's left-padded prompts (row r's prompt in the last
    prompt_lengths[r]); column widths[c] + k holds response token k, for every token but
    the row's last."""

    caches: list[object]
    widths: list[int]
    starts: list[int]
    prompt_lengths: list[int]

    def locate(self, row: int) -> tuple[object, int, int]:
        """(chunk cache, row in it, its prompt width) of row `row`."""
        c = max(i for i, start in enumerate(self.starts) if start <= row)
        return self.caches[c], row - self.starts[c], self.widths[c]


def preallocate(cache: object, extra: int) -> object:
    """`cache` with room for `extra` more positions in every layer, filled in place.

    Only plain `DynamicLayer`s are converted (sliding-window, linear-attention or other
    layers, and caches of older transformers, keep growing their own way); the cache object
    is the same, its layers swapped."""
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not layers:
        return cache
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            layers[i] = PreallocatedLayer(layer.keys, layer.values, extra)
    return cache


if DynamicLayer is not None:

    class PreallocatedLayer(DynamicLayer):
        """A `DynamicLayer` whose keys and values sit in buffers with room for `extra` more
        positions: `update` writes the new ones in place and returns views of the filled
        part (the same values `torch.cat` would give, without copying the cache)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, extra: int) -> None:
            super().__init__()
            self.device = keys.device
            self.is_initialized = True
            self._length = keys.shape[-2]
            self._keys = _with_room(keys, extra)
            self._values = _with_room(values, extra)
            self._views()

        def _views(self) -> None:
            self.keys = self._keys[..., : self._length, :]
            self.values = self._values[..., : self._length, :]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kw: object
        ) -> tuple[torch.Tensor, torch.Tensor]:
            new = key_states.shape[-2]
            if self._length + new > self._keys.shape[-2]:  # past the room: grow by copying
                self._keys = _with_room(self.keys, new)
                self._values = _with_room(self.values, new)
            self._keys[..., self._length : self._length + new, :] = key_states
            self._values[..., self._length : self._length + new, :] = value_states
            self._length += new
            self._views()
            return self.keys, self.values

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:  # DynamicLayer's contract: a negative count
                raise ValueError(f"crop takes a negative count, got {tokens_to_remove}")
            self._length = max(self._length + tokens_to_remove, 0)
            self._views()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self._views()

        def reorder_cache(self, beam_idx: torch.Tensor) -> None:
            self.batch_select_indices(beam_idx.to(self.device))

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._keys = self._keys.repeat_interleave(repeats, dim=0)
            self._values = self._values.repeat_interleave(repeats, dim=0)
            self._views()

        def reset(self) -> None:
            self._length = 0
            self._views()


def _with_room(x: torch.Tensor, extra: int) -> torch.Tensor:
    """A copy of `x` [..., L, d] in a buffer of length L + `extra` along dim -2."""
    buffer = x.new_empty((*x.shape[:-2], x.shape[-2] + extra, x.shape[-1]))
    buffer[..., : x.shape[-2], :] = x
    return buffer


@contextmanager
def head_inputs(model: PreTrainedModel, enabled: bool) -> Iterator[list[torch.Tensor]]:
    """Collect, at every forward, the last position's input of the LM head (the hidden state
    that produced the sampled token's logits; GAR reads it). Yields the list it fills."""
    steps: list[torch.Tensor] = []
    if not enabled:
        yield steps
        return
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: steps.append(args[0][:, -1].detach().float())
    )
    try:
        yield steps
    finally:
        hook.remove()


def to_rollouts(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    d: Decoded,
    hidden_steps: list[torch.Tensor],
) -> Rollouts:
    """Rollouts on the CPU from decoded tokens; padding zeroed in logp, entropy and hidden."""
    hidden = None
    if hidden_steps:
        hidden = (torch.stack(hidden_steps[: d.tokens.shape[1]], 1) * d.mask[..., None]).cpu()
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=d.tokens.cpu(),
        response_mask=d.mask.cpu(),
        logp=(d.logp * d.mask).cpu(),
        entropies=(d.entropies * d.mask).cpu(),
        truncated=(~d.finished).cpu(),
        generated_tokens=int(d.mask.sum().item()),
        hidden=hidden,
        allowed_bits=d.allowed_bits,
    )
