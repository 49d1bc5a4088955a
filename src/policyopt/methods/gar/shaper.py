"""The `gar` reward shaper: GAR rewards for a batch, composable with any preset (SPEC §3).

Per step, for the rollouts that passed the verifier only (no signal is computed for wrong
rollouts, nor an anchor for a prompt without a correct rollout):
1. v_i from the hidden states the rollout engine recorded while sampling (the policy that
   sampled is the current one: shaping runs before the update). An engine that records none
   gets one teacher-forced no-grad pass over the correct rollouts instead.
2. v_a for each expert solution of the prompt (column `solution_column`; a list means several
   anchors), from one teacher-forced no-grad pass over [prompt | solution + EOS] under the
   current policy; computed once per (prompt, solution) per step and cached within the step.
   All of a step's new anchors go through the trunk together (FORWARD_BATCH rows at a time);
   the LM head is not applied there (the signal forms its logits itself, in chunks). An
   anchor that a correct rollout of its prompt sampled token for token (solution + EOS: a
   warm-started policy often writes the expert's solution verbatim) needs no pass: its v_a is
   that rollout's v, the same function of the same tokens under the same policy, from hidden
   states recorded while sampling rather than teacher-forced (equal up to rounding).
3. b_i = best cosine over the main anchors, folded with the `aux_column` anchors by
   `aux_residual` if that option is set; then `gar_rewards` (centring, r_base, β).
The task reward M (the verifier's correctness term, `reward.task_function`) is replaced:
correct -> r_base + β max(0, b̂), wrong -> 0. A correct rollout whose problem has no solution
gets r_base. Every other term adds as configured (`policyopt.rewards.shaping`): the other
weighted reward functions (a format penalty, a length bonus) and additive shapers (DAPO's
overlong penalty). Only the reasoning span (`span_regex`, see spans.py) enters v, capped to
its last `max_span_tokens` tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from policyopt.methods.gar.rewards import AUX_WEIGHT, BETA, R_BASE, aggregate_anchors, gar_rewards
from policyopt.methods.gar.signal import batched_gradient_signal, output_layer
from policyopt.methods.gar.spans import span_mask, token_spans
from policyopt.models.logprobs import position_ids_from_mask, trunk_of
from policyopt.rewards.shaping import SHAPERS, RewardShaper, ShapingContext

MAX_SPAN_TOKENS = 768  # SPEC §3 (paper)
MAX_ANCHORS = 4  # per anchor set, after de-duplication (authors' code default)
FORWARD_BATCH = 32  # sequences per teacher-forced no-grad pass


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def solutions_of(value: Any, limit: int) -> list[str]:
    """Anchor texts of one row: a string or a list of them; blanks and repeats (up to
    whitespace) dropped, at most `limit` kept."""
    items = [value] if isinstance(value, str) else list(value or [])
    seen, out = set(), []
    for text in items:
        key = " ".join(str(text).split())
        if key and key not in seen:
            seen.add(key)
            out.append(str(text))
    return out[:limit]


@SHAPERS.register("gar")
class GARShaper(RewardShaper):
    """GAR rewards (module docstring). Options: r_base, beta, solution_column, aux_column,
    aux_weight, max_anchors, chunk_size (tokens per LM-head chunk; None: the trainer's
    model.logit_chunk_size), max_span_tokens, span_regex."""

    needs_hidden = True  # the engine records rollouts.hidden

    def __init__(
        self,
        r_base: float = R_BASE,
        beta: float = BETA,
        solution_column: str = "solution",
        aux_column: str | None = None,
        aux_weight: float = AUX_WEIGHT,
        max_anchors: int = MAX_ANCHORS,
        chunk_size: int | None = None,
        max_span_tokens: int = MAX_SPAN_TOKENS,
        span_regex: str | None = None,
    ) -> None:
        if beta < 0 or aux_weight < 0:
            raise ValueError(f"gar: beta and aux_weight must be >= 0, got {beta}, {aux_weight}")
        if max_anchors < 1 or max_span_tokens < 1 or (chunk_size is not None and chunk_size < 1):
            raise ValueError(
                "gar: max_anchors, max_span_tokens and chunk_size must be >= 1, got "
                f"{max_anchors}, {max_span_tokens}, {chunk_size}"
            )
        self.r_base, self.beta = float(r_base), float(beta)
        self.solution_column, self.aux_column = solution_column, aux_column
        self.aux_weight, self.max_anchors = float(aux_weight), int(max_anchors)
        self.chunk_size, self.max_span_tokens = chunk_size, int(max_span_tokens)
        self.pattern = re.compile(span_regex, re.DOTALL) if span_regex else None
        self._cache: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}
        self._cache_step: int | None = None

    # ------------------------------------------------------------------ the batch
    def __call__(
        self, rewards: torch.Tensor, ctx: ShapingContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        correct = ctx.correct.bool().cpu()
        rows = correct.nonzero().squeeze(-1)
        cosine = torch.full((len(correct),), float("nan"))
        metrics: dict[str, float] = {"gar/anchor_sequences": 0.0}
        if len(rows):
            with torch.no_grad():  # truncated backprop is closed form: no autograd needed
                cosine[rows], metrics = self._cosines(rows, ctx)
        has_anchor = ~torch.isnan(cosine)
        shaped = gar_rewards(
            correct & has_anchor, cosine, ctx.group_ids.cpu(), self.r_base, self.beta
        )
        shaped[correct & ~has_anchor] = self.r_base
        bonus = (shaped - self.r_base)[correct]
        metrics["gar/cosine_correct_mean"] = (
            float(cosine[has_anchor].mean()) if has_anchor.any() else 0.0
        )
        metrics["gar/bonus_mean"] = float(bonus.mean()) if len(bonus) else 0.0
        metrics["gar/fraction_rewarded"] = float((bonus > 0).float().mean()) if len(bonus) else 0.0
        return shaped.to(rewards.dtype).to(rewards.device), metrics

    def _cosines(
        self, rows: torch.Tensor, ctx: ShapingContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """b_i [K] for the correct rollouts `rows` (NaN where the problem has no anchor)."""
        if ctx.step != self._cache_step:  # the policy moved: anchors are recomputed
            self._cache, self._cache_step = {}, ctx.step
        metrics: dict[str, float] = {}
        weight, bias = output_layer(ctx.model)
        v, fallbacks = self._rollout_signals(rows, ctx, weight, bias)
        if self.pattern is not None:
            metrics["gar/span_fallback_fraction"] = fallbacks / len(rows)
        sets = [self._column(ctx, self.solution_column)]
        if self.aux_column is not None:
            sets.append(self._column(ctx, self.aux_column))
        prompts = self._prompt_ids(rows, ctx)
        texts = [[column[r] for r in rows.tolist()] for column in sets]  # [set][K][anchors]
        wanted = {
            (p, t) for column in texts for p, ts in zip(prompts, column, strict=True) for t in ts
        }
        missing = sorted(wanted - set(self._cache))
        metrics["gar/anchor_sequences"] = float(len(missing))
        answers = self._answer_ids(missing, ctx)
        sampled = self._sampled_anchors(missing, answers, rows, prompts, v, ctx)
        metrics["gar/anchors_sampled"] = float(len(sampled))
        self._cache.update(sampled)
        forced = [i for i, key in enumerate(missing) if key not in sampled]
        self._cache.update(
            self._anchor_signals(
                [missing[i] for i in forced], [answers[i] for i in forced], ctx, weight, bias
            )
        )
        best = [self._best(v, prompts, column) for column in texts]
        b = best[0] if len(best) == 1 else aggregate_anchors(best[0], best[1], self.aux_weight)
        return b.cpu(), metrics

    def _column(self, ctx: ShapingContext, name: str) -> list[list[str]]:
        if name not in ctx.columns:
            raise KeyError(f"gar: no dataset column {name!r}; the batch has {sorted(ctx.columns)}")
        return [solutions_of(value, self.max_anchors) for value in ctx.columns[name]]

    def _best(
        self, v: torch.Tensor, prompts: list[tuple[int, ...]], texts: list[list[str]]
    ) -> torch.Tensor:
        """max over a rollout's anchors of v_i^T v_a (unit vectors); NaN without anchors.
        One [K, d] x [d, A] product over the distinct anchors, then a masked max per row."""
        index: dict[tuple[tuple[int, ...], str], int] = {}
        slots = [
            [index.setdefault((p, a), len(index)) for a in ts]
            for p, ts in zip(prompts, texts, strict=True)
        ]
        out = torch.full((len(v),), float("nan"), device=v.device)
        if not index:
            return out
        anchors = torch.stack([self._cache[key] for key in index])  # [A, d]
        width = max(map(len, slots))
        pick = torch.tensor([row + [-1] * (width - len(row)) for row in slots], device=v.device)
        cos = (v @ anchors.T).gather(1, pick.clamp(min=0))  # [K, width]: v_i^T v_a
        best = cos.masked_fill(pick < 0, float("-inf")).max(-1).values
        has = pick[:, 0] >= 0
        return torch.where(has, best, out)

    def _prompt_ids(self, rows: torch.Tensor, ctx: ShapingContext) -> list[tuple[int, ...]]:
        ids, mask = ctx.rollouts.prompt_ids[rows].tolist(), ctx.rollouts.prompt_mask[rows].tolist()
        return [
            tuple(t for t, m in zip(i, ms, strict=True) if m)
            for i, ms in zip(ids, mask, strict=True)
        ]

    # ------------------------------------------------------------------ signals
    def _chunk(self, ctx: ShapingContext) -> int:
        return self.chunk_size or ctx.logit_chunk_size

    def _spans(
        self, ids: Callable[[], list[list[int]]], lengths: list[int], ctx: ShapingContext
    ) -> tuple[list[tuple[int, int]], int]:
        """Token spans of sequences of `lengths` (their ids from `ids()`, only read, and
        decoded, when a span_regex is set) and the number of span fallbacks."""
        if self.pattern is None:  # the whole sequence, capped to its last max_span_tokens
            return [(max(0, n - self.max_span_tokens), n) for n in lengths], 0
        return token_spans(ids(), self._decode(ctx), self.pattern, self.max_span_tokens)

    def _rollout_signals(
        self, rows: torch.Tensor, ctx: ShapingContext, weight: torch.Tensor, bias: Any
    ) -> tuple[torch.Tensor, int]:
        """v [K, d] of the rollouts `rows` (on the head's device) and the number of span
        fallbacks."""
        r = ctx.rollouts
        lengths = r.lengths[rows].tolist()
        spans, fallbacks = self._spans(
            lambda: [
                row[:n] for row, n in zip(r.response_ids[rows].tolist(), lengths, strict=True)
            ],
            lengths,
            ctx,
        )
        width = max(e for _, e in spans)
        device = weight.device
        if r.hidden is not None:
            hidden = r.hidden[rows, :width].to(device)
        else:  # engines that record no hidden states: one teacher-forced pass
            hidden = teacher_forced_hidden(
                ctx.model, r.input_ids()[rows], r.attention_mask()[rows], r.response_ids.shape[1]
            )[:, :width]
        v = batched_gradient_signal(
            hidden,
            span_mask(spans, width).to(device),
            weight.detach(),
            None if bias is None else bias.detach(),
            r.response_ids[rows, :width].to(device),
            self._chunk(ctx),
        )
        return v, fallbacks

    def _answer_ids(
        self, keys: Sequence[tuple[tuple[int, ...], str]], ctx: ShapingContext
    ) -> list[list[int]]:
        """Token ids of each key's solution text, + EOS (one batched tokenizer call)."""
        if not keys:
            return []
        tok = ctx.tokenizer
        encoded = tok([text for _, text in keys], add_special_tokens=False)["input_ids"]
        return [ids + [tok.eos_token_id] for ids in encoded]

    def _sampled_anchors(
        self,
        keys: Sequence[tuple[tuple[int, ...], str]],
        answers: Sequence[list[int]],
        rows: torch.Tensor,
        prompts: list[tuple[int, ...]],
        v: torch.Tensor,
        ctx: ShapingContext,
    ) -> dict[tuple[tuple[int, ...], str], torch.Tensor]:
        """v_a of the anchors that a correct rollout (`rows`, signals `v`) of the same prompt
        sampled token for token: that rollout's v (module docstring, step 2)."""
        if not keys:
            return {}
        r = ctx.rollouts
        lengths = r.lengths[rows].tolist()
        sampled: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        for k, (p, ids, n) in enumerate(
            zip(prompts, r.response_ids[rows].tolist(), lengths, strict=True)
        ):
            sampled.setdefault((p, tuple(ids[:n])), k)
        found = (
            (key, sampled.get((key[0], tuple(a)))) for key, a in zip(keys, answers, strict=True)
        )
        return {key: v[k] for key, k in found if k is not None}

    def _anchor_signals(
        self,
        keys: Sequence[tuple[tuple[int, ...], str]],
        answers: Sequence[list[int]],
        ctx: ShapingContext,
        weight: torch.Tensor,
        bias: Any,
    ) -> dict[tuple[tuple[int, ...], str], torch.Tensor]:
        """v_a of each (prompt ids, solution text) with the solution's ids + EOS `answers`,
        teacher-forced under the current policy (on the head's device)."""
        if not keys:
            return {}
        tok = ctx.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        spans, _ = self._spans(lambda: list(answers), list(map(len, answers)), ctx)
        out: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}
        for start in range(0, len(keys), FORWARD_BATCH):
            part = slice(start, start + FORWARD_BATCH)
            ids, mask, width = _pack([p for p, _ in keys[part]], answers[part], pad)
            hidden = teacher_forced_hidden(ctx.model, ids, mask, width)
            v = batched_gradient_signal(
                hidden,
                span_mask(spans[part], width).to(hidden.device),
                weight.detach(),
                None if bias is None else bias.detach(),
                ids[:, -width:].to(hidden.device),
                self._chunk(ctx),
            )
            out.update(zip(keys[part], v, strict=True))
        return out

    def _decode(self, ctx: ShapingContext) -> Any:
        return lambda ids: ctx.tokenizer.decode(list(ids), skip_special_tokens=True)


def teacher_forced_hidden(
    model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, width: int
) -> torch.Tensor:
    """The final (normed) hidden states [B, width, d] that enter the LM head and predict the
    last `width` tokens of `ids` [B, L] (left-padded per `mask`): one no-grad trunk pass in
    eval mode over positions 0 .. L-2, as `response_logprobs` runs it, without its LM head
    (the signal forms its logits itself, in chunks)."""
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad(), _eval_mode(model):
        out = trunk_of(model)(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=position_ids_from_mask(mask)[:, :-1],
            use_cache=False,
        )
    return out.last_hidden_state[:, -width:]


def _pack(
    prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """[left-padded prompt | right-padded answer] ids and mask [B, P + A], and A."""
    p, a = max(map(len, prompts)), max(map(len, answers))
    ids = torch.full((len(prompts), p + a), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (q, s) in enumerate(zip(prompts, answers, strict=True)):
        ids[row, p - len(q) : p] = torch.tensor(q)
        ids[row, p : p + len(s)] = torch.tensor(s)
        mask[row, p - len(q) : p + len(s)] = 1
    return ids, mask, a
