"""The `gar` reward shaper: GAR rewards for a batch, composable with any preset (SPEC §3).

Per step, for the rollouts that passed the verifier only (no signal is computed for wrong
rollouts, nor an anchor for a prompt without a correct rollout):
1. v_i from the hidden states the rollout engine recorded (the policy that sampled is the
   current one: shaping runs before the update): the hf engine's while sampling, the vllm
   engine's from the trainer forward that computes its entropies (`entropies=trainer`). An
   engine that records none (vllm without that pass) gets one no-grad pass of the trainer's
   trunk over the correct rollouts only, FORWARD_BATCH rows at a time, each cut to the
   longest span it needs, a group's copies of a prompt run once (`response_hidden`);
   `gar/rollout_pass_rows` counts its rows (0 when the engine's hidden states served).
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

The authors' code (github.com/LQgdwind/GAR; defaults.py, think_format.py) adds, as options:
- `anchor_aggregation`: how the `aux_column` anchors fold in (rewards.py).
- `format_tags`: the strict format (think_format.py) is checked on every completion; then
  `format_gate` makes a malformed rollout fail (M' = 0, no signal computed), and additive terms
  `gar_format_bonus` (valid: `format_bonus`), `gar_invalid_format` (malformed:
  `invalid_format_penalty`) and `gar_think_length` (valid: p(n) with `think_penalty` at most,
  thresholds from the first main anchor's think length) join the reward of every rollout,
  passing or failing, before the group normalisation.
- `think_span`: v is taken over the response's THINK tokens only (the whole response when it
  is not in the strict format), and each anchor is its think part (or all of it when untagged),
  teacher-forced straight after the prompt without EOS, as in the authors' code.
The `gar_authors` preset sets all of them to the authors' values (defaults.AUTHORS_OPTIONS).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import nn

from policyopt.methods.gar.defaults import (
    ANCHOR_AGGREGATION,
    AUX_WEIGHT,
    BETA,
    MAX_ANCHORS,
    MAX_SPAN_TOKENS,
    R_BASE,
    THINK_FALLBACK,
    THINK_HARD_RATIO,
    THINK_RELATIVE,
    THINK_TARGET_RANGE,
    THINK_TARGET_RATIO,
)
from policyopt.methods.gar.rewards import aggregate_anchors, gar_rewards
from policyopt.methods.gar.signal import batched_gradient_signal, output_layer
from policyopt.methods.gar.spans import char_to_token_span, span_mask, token_spans
from policyopt.methods.gar.think_format import (
    StrictFormat,
    anchor_think_text,
    check_think_options,
    parse_strict,
    think_length_penalty,
    think_thresholds,
)
from policyopt.models.logprobs import position_ids_from_mask, response_hidden, trunk_of
from policyopt.rewards.shaping import SHAPERS, RewardShaper, ShapingContext
from policyopt.rollout.base import Rollouts

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
    aux_weight, anchor_aggregation, max_anchors, chunk_size (tokens per LM-head chunk; None:
    the trainer's model.logit_chunk_size), max_span_tokens, span_regex; the authors' reward
    post-processing: format_tags, format_gate, format_bonus, invalid_format_penalty,
    think_span, think_penalty, think_relative, think_target_ratio, think_target_range,
    think_hard_ratio, think_fallback (off unless format_tags is set; defaults.py)."""

    needs_hidden = True  # asks the engine for rollouts.hidden (else its own pass: docstring)

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
        anchor_aggregation: Literal["aux_residual", "real_only", "aux_max"] = ANCHOR_AGGREGATION,
        format_tags: list[str] | None = None,
        format_gate: bool = False,
        format_bonus: float = 0.0,
        invalid_format_penalty: float = 0.0,
        think_span: bool = False,
        think_penalty: float = 0.0,
        think_relative: bool = THINK_RELATIVE,
        think_target_ratio: float = THINK_TARGET_RATIO,
        think_target_range: tuple[int, int] = THINK_TARGET_RANGE,
        think_hard_ratio: float = THINK_HARD_RATIO,
        think_fallback: tuple[int, int] = THINK_FALLBACK,
    ) -> None:
        if beta < 0 or aux_weight < 0:
            raise ValueError(f"gar: beta and aux_weight must be >= 0, got {beta}, {aux_weight}")
        if max_anchors < 1 or max_span_tokens < 1 or (chunk_size is not None and chunk_size < 1):
            raise ValueError(
                "gar: max_anchors, max_span_tokens and chunk_size must be >= 1, got "
                f"{max_anchors}, {max_span_tokens}, {chunk_size}"
            )
        aggregate_anchors(torch.zeros(1), torch.zeros(1), aux_weight, anchor_aggregation)
        self.r_base, self.beta = float(r_base), float(beta)
        self.solution_column, self.aux_column = solution_column, aux_column
        self.aux_weight, self.max_anchors = float(aux_weight), int(max_anchors)
        self.anchor_aggregation = anchor_aggregation
        self.chunk_size, self.max_span_tokens = chunk_size, int(max_span_tokens)
        self.pattern = re.compile(span_regex, re.DOTALL) if span_regex else None
        self._set_post_processing(
            format_tags,
            format_gate,
            format_bonus,
            invalid_format_penalty,
            think_span,
            think_penalty,
        )
        check_think_options(
            think_penalty, think_target_ratio, think_target_range, think_hard_ratio, think_fallback
        )
        self.think_thresholds = {
            "relative": bool(think_relative),
            "target_ratio": float(think_target_ratio),
            "target_range": (int(think_target_range[0]), int(think_target_range[1])),
            "hard_ratio": float(think_hard_ratio),
            "fallback": (int(think_fallback[0]), int(think_fallback[1])),
        }
        self._cache: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}
        self._cache_step: int | None = None

    def _set_post_processing(
        self,
        tags: list[str] | None,
        gate: bool,
        bonus: float,
        invalid: float,
        think_span: bool,
        think_penalty: float,
    ) -> None:
        if tags is None:
            used = {
                "format_gate": gate,
                "format_bonus": bonus,
                "invalid_format_penalty": invalid,
                "think_span": think_span,
                "think_penalty": think_penalty,
            }
            named = [k for k, v in used.items() if v]
            if named:
                raise ValueError(f"gar: {', '.join(named)} need format_tags (the strict format)")
        elif len(tags) != 4 or not all(isinstance(t, str) and t for t in tags):
            raise ValueError(
                "gar: format_tags must be 4 non-empty strings (think open, think close, answer "
                f"open, answer close), got {tags!r}"
            )
        if think_span and self.pattern is not None:
            raise ValueError("gar: think_span and span_regex both choose the span; set one")
        self.format_tags = None if tags is None else tuple(tags)
        self.format_gate, self.format_bonus = bool(gate), float(bonus)
        self.invalid_format_penalty = float(invalid)
        self.think_span, self.think_penalty = bool(think_span), float(think_penalty)

    # ------------------------------------------------------------------ the batch
    def __call__(
        self, rewards: torch.Tensor, ctx: ShapingContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        correct = ctx.correct.bool().cpu()
        metrics: dict[str, float] = {"gar/anchor_sequences": 0.0, "gar/rollout_pass_rows": 0.0}
        if self.format_tags is not None:
            parsed = [parse_strict(text, self.format_tags) for text in ctx.completions]
            valid = torch.tensor([p is not None for p in parsed], dtype=torch.bool)
            metrics |= self._post_processing(parsed, valid, rewards, ctx)
            if self.format_gate:  # a malformed rollout fails whatever its verdict
                metrics["gar/gated_fraction"] = float((correct & ~valid).float().mean())
                correct = correct & valid
        rows = correct.nonzero().squeeze(-1)
        cosine = torch.full((len(correct),), float("nan"))
        if len(rows):
            with torch.no_grad():  # truncated backprop is closed form: no autograd needed
                cosine[rows], found = self._cosines(rows, ctx)
            metrics |= found
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

    # ------------------------------------------------------------------ post-processing
    def _post_processing(
        self,
        parsed: list[StrictFormat | None],
        valid: torch.Tensor,
        rewards: torch.Tensor,
        ctx: ShapingContext,
    ) -> dict[str, float]:
        """The authors' additive terms (module docstring), on every rollout."""

        def term(name: str, values: torch.Tensor) -> None:
            ctx.add_term(name, values.to(rewards.dtype).to(rewards.device))

        metrics = {"gar/format_valid_fraction": float(valid.float().mean())}
        if self.format_bonus:
            term("gar_format_bonus", valid.float() * self.format_bonus)
        if self.invalid_format_penalty:
            term("gar_invalid_format", (~valid).float() * self.invalid_format_penalty)
        if self.think_penalty:
            penalty = self._think_penalties(parsed, ctx)
            term("gar_think_length", penalty)
            metrics["gar/think_penalty_mean"] = float(penalty.mean())
        return metrics

    def _think_penalties(
        self, parsed: list[StrictFormat | None], ctx: ShapingContext
    ) -> torch.Tensor:
        """p(n) [N] for the well-formed rollouts (0 for the others): n = tokens of THINK,
        thresholds from the think length of the row's first main anchor (think_format.py)."""
        out = torch.zeros(len(parsed))
        found = [(i, p.think) for i, p in enumerate(parsed) if p is not None]
        if not found:
            return out
        assert self.format_tags is not None
        rows = [i for i, _ in found]
        think = [ctx.completions[i][start:end] for i, (start, end) in found]
        column = self._column(ctx, self.solution_column, 1)
        anchors = [
            anchor_think_text(column[i][0], *self.format_tags[:2]) if column[i] else ""
            for i in rows
        ]
        lengths = self._token_counts(ctx, think + anchors)
        n, a = lengths[: len(rows)], lengths[len(rows) :]
        for i, n_i, a_i in zip(rows, n, a, strict=True):
            hard, target = think_thresholds(a_i, **self.think_thresholds)
            out[i] = think_length_penalty(n_i, hard, target, self.think_penalty)
        return out

    def _token_counts(self, ctx: ShapingContext, texts: list[str]) -> list[int]:
        """Tokens of each text (without special tokens; "" has none): one tokenizer call."""
        ids = ctx.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [len(x) if t else 0 for x, t in zip(ids, texts, strict=True)]

    def _cosines(
        self, rows: torch.Tensor, ctx: ShapingContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """b_i [K] for the correct rollouts `rows` (NaN where the problem has no anchor)."""
        if ctx.step != self._cache_step:  # the policy moved: anchors are recomputed
            self._cache, self._cache_step = {}, ctx.step
        metrics: dict[str, float] = {}
        weight, bias = output_layer(ctx.model)
        v, fallbacks, pass_rows = self._rollout_signals(rows, ctx, weight, bias)
        metrics["gar/rollout_pass_rows"] = float(pass_rows)
        if self.pattern is not None or self.think_span:
            metrics["gar/span_fallback_fraction"] = fallbacks / len(rows)
        sets = [self._anchors(ctx, self.solution_column)]
        if self.aux_column is not None:
            sets.append(self._anchors(ctx, self.aux_column))
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
        b = best[0]
        if len(best) == 2:
            b = aggregate_anchors(best[0], best[1], self.aux_weight, self.anchor_aggregation)
        return b.cpu(), metrics

    def _column(self, ctx: ShapingContext, name: str, limit: int) -> list[list[str]]:
        if name not in ctx.columns:
            raise KeyError(f"gar: no dataset column {name!r}; the batch has {sorted(ctx.columns)}")
        return [solutions_of(value, limit) for value in ctx.columns[name]]

    def _anchors(self, ctx: ShapingContext, name: str) -> list[list[str]]:
        """Each row's anchor texts in column `name`; with think_span, their think parts
        (empty ones dropped), as the authors' code compares them."""
        column = self._column(ctx, name, self.max_anchors)
        if not self.think_span:
            return column
        assert self.format_tags is not None
        think = [[anchor_think_text(t, *self.format_tags[:2]) for t in ts] for ts in column]
        return [[t for t in ts if t] for ts in think]

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
        decoded, when a span_regex or think_span is set) and the number of span fallbacks."""
        if self.think_span:
            return self._think_spans(ids(), ctx)
        if self.pattern is None:  # the whole sequence, capped to its last max_span_tokens
            return [(max(0, n - self.max_span_tokens), n) for n in lengths], 0
        return token_spans(ids(), self._decode(ctx), self.pattern, self.max_span_tokens)

    def _think_spans(
        self, token_ids: list[list[int]], ctx: ShapingContext
    ) -> tuple[list[tuple[int, int]], int]:
        """The tokens of each response's THINK (the whole response where the decoded text is
        not in the strict format or THINK is empty), capped to the last max_span_tokens, and
        the number of such fallbacks."""
        assert self.format_tags is not None
        decode, spans, fallbacks = self._decode(ctx), [], 0
        for ids in token_ids:
            t0, t1 = 0, len(ids)
            parsed = parse_strict(decode(ids), self.format_tags)
            if parsed is None or parsed.think[0] == parsed.think[1]:
                fallbacks += 1
            else:
                t0, t1 = char_to_token_span(
                    *parsed.think, len(ids), lambda k, ids=ids: len(decode(ids[:k]))
                )
            spans.append((max(t0, t1 - self.max_span_tokens), t1))
        return spans, fallbacks

    def _rollout_signals(
        self, rows: torch.Tensor, ctx: ShapingContext, weight: torch.Tensor, bias: Any
    ) -> tuple[torch.Tensor, int, int]:
        """v [K, d] of the rollouts `rows` (on the head's device), the number of span
        fallbacks, and the rows this call ran the trunk over (0 with recorded hidden states)."""
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
        else:  # engines that record no hidden states: one pass of the trunk (docstring)
            hidden = rollout_hidden(ctx.model, r, rows, width).to(device)
        v = batched_gradient_signal(
            hidden,
            span_mask(spans, width).to(device),
            weight.detach(),
            None if bias is None else bias.detach(),
            r.response_ids[rows, :width].to(device),
            self._chunk(ctx),
        )
        return v, fallbacks, 0 if r.hidden is not None else len(rows)

    def _answer_ids(
        self, keys: Sequence[tuple[tuple[int, ...], str]], ctx: ShapingContext
    ) -> list[list[int]]:
        """Token ids of each key's solution text, + EOS (one batched tokenizer call); with
        think_span no EOS: the anchor is a think part, teacher-forced alone (authors' code)."""
        if not keys:
            return []
        tok = ctx.tokenizer
        encoded = tok([text for _, text in keys], add_special_tokens=False)["input_ids"]
        eos = [] if self.think_span else [tok.eos_token_id]
        return [ids + eos for ids in encoded]

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
        lengths = list(map(len, answers))
        if self.think_span:  # the anchor is already its think part: all of it
            spans = [(max(0, n - self.max_span_tokens), n) for n in lengths]
        else:
            spans, _ = self._spans(lambda: list(answers), lengths, ctx)
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


def rollout_hidden(model: nn.Module, r: Rollouts, rows: torch.Tensor, width: int) -> torch.Tensor:
    """The LM head's inputs [K, width, d] at the first `width` response tokens of rollouts
    `rows`: no-grad trunk passes in eval mode over [prompt | those tokens], FORWARD_BATCH rows
    at a time, rows with the same prompt sharing its pass (`response_hidden`), as the
    trainer's `response_logprobs` computes them."""
    device = next(model.parameters()).device
    cut = r.prompt_ids.shape[1] + width  # nothing past the longest span is needed
    ids, mask = r.input_ids()[rows, :cut], r.attention_mask()[rows, :cut]
    parts = []
    with torch.no_grad(), _eval_mode(model):
        for start in range(0, len(rows), FORWARD_BATCH):
            part = slice(start, start + FORWARD_BATCH)
            parts.append(response_hidden(model, ids[part].to(device), mask[part].to(device), width))
    return torch.cat(parts)


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
