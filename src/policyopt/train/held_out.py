"""Held-out evaluation: greedy accuracy, and pass@k / avg@k / maj@k from k samples.

A sample is correct when its task reward is >= `correct_threshold`, the config's
`reward.correct_threshold`: the one value training (accuracy, `trainer.step`) and
evaluation both count with, so that e.g. DocPO's continuous rewards count as correct from
0.99 in both. It has no default here, so no caller can count with another value.

The task's verifier is called the way training calls it (`verified`): through the reward
pipeline's one call path, on its own copies of the rows, within a time limit, and with
anything it raises or returns wrong a one-line named error. A verifier can run code the
user brought (a `verifiers` taskset's `@vf.reward` methods), and the rows and texts it is
handed are used again by later calls and by the metrics.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import datasets
from rich.console import Console

from policyopt.core import avg_at_k, maj_at_k, pass_at_k
from policyopt.rewards import isolation
from policyopt.rewards.functions import (
    RewardFunctionError,
    score_reward_function,
    task_reward_function,
)
from policyopt.rollout.base import RolloutEngine, Rollouts, SamplingParams, concat_structure
from policyopt.store.metrics_log import progress_bar
from policyopt.tasks.base import Task
from policyopt.train.prompts import decode, encode_prompts

# A summary of the greedy responses: (name, per-response values of one generation batch).
ResponseSummary = tuple[str, Callable[[Rollouts], list[float]]]
# How held-out responses are sampled when not by `engine.generate(prompts, params)` alone:
# (engine, prompts, params, rows=...) -> rollouts, one per prompt (the `multi_turn`
# strategy's episodes, with the run's environment, each started from its prompt's row).
Generate = Callable[..., Rollouts]


@dataclass(frozen=True)
class EvalSettings:
    """What a run's config says of held-out evaluation (built once, `train.parts`)."""

    size: int
    max_new_tokens: int
    samples: int
    temperature: float
    chat: bool
    correct_threshold: float
    progress: bool
    summaries: list[ResponseSummary] = field(default_factory=list)
    generate: Generate | None = None  # None: the engine's own `generate`


def evaluate_run(
    settings: EvalSettings,
    task: Task,
    tokenizer: Any,
    engine: RolloutEngine,
    *,
    rows: datasets.Dataset | None = None,
    samples: int | None = None,
    console: Console | None = None,
    reward_fn: Callable[..., Any] | None = None,
) -> dict[str, float]:
    """`evaluate` with a run's settings: its held-out rows unless `rows` are given, its
    `eval.samples` unless `samples` is."""
    return evaluate(
        task=task,
        rows=eval_rows(task, settings.size) if rows is None else rows,
        tokenizer=tokenizer,
        engine=engine,
        max_new_tokens=settings.max_new_tokens,
        samples=settings.samples if samples is None else samples,
        temperature=settings.temperature,
        chat=settings.chat,
        correct_threshold=settings.correct_threshold,
        summaries=settings.summaries,
        console=console,
        progress=settings.progress,
        reward_fn=reward_fn,
        generate=settings.generate,
    )


def evaluate(
    *,
    task: Task,
    rows: datasets.Dataset,
    tokenizer: Any,
    engine: RolloutEngine,
    max_new_tokens: int,
    samples: int = 0,
    temperature: float = 1.0,
    chat: bool = False,
    ks: list[int] | None = None,
    correct_threshold: float,
    summaries: list[ResponseSummary] | None = None,
    console: Console | None = None,
    progress: bool = False,
    reward_fn: Callable[..., Any] | None = None,
    generate: Generate | None = None,
) -> dict[str, float]:
    """Greedy accuracy over `rows`, and the greedy responses' median length in tokens and
    the median of each of `summaries` (`eval/<name>_median`: e.g. HISPO's segments per
    response, from the responses' own entropies); with `samples` = n > 0 also pass@k, avg@n, maj@n and the
    mean number of distinct correct answers per problem. A reward >= `correct_threshold`
    is correct (module docstring). `progress`: a bar (plain lines off a terminal) of the
    completions generated so far. `reward_fn` (the run's `RewardPipeline`): also
    `eval/weighted_reward`, the mean of the run's weighted reward on the greedy completions
    (`eval/reward` is the task's own check alone). `generate`: how responses are sampled,
    when not by the engine alone (a multi-turn run's episodes)."""
    picked = [rows[i] for i in range(len(rows))]
    prompts, ids = encode_prompts(task, tokenizer, picked, chat)
    with progress_bar(console, progress, plain=True) as bar:  # may run under train's bar
        total = len(ids) * (1 + max(samples, 0))
        bar_id = bar.add_task("eval", total=total, status="greedy")
        texts, greedy = _generate(
            engine,
            tokenizer,
            ids,
            SamplingParams(max_new_tokens=max_new_tokens, greedy=True),
            lambda n: bar.update(bar_id, advance=n),
            generate,
            picked,
        )
        sampled = []
        if samples > 0:
            bar.update(bar_id, status=f"{samples} samples per problem")
            sampled, _ = _generate(
                engine,
                tokenizer,
                [p for p in ids for _ in range(samples)],
                SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
                lambda n: bar.update(bar_id, advance=n),
                generate,
                [row for row in picked for _ in range(samples)],
            )
    limit = verify_time_limit(reward_fn)
    scores = verified(task, prompts, texts, picked, "greedy completions", limit)
    out = {"eval/accuracy": sum(s >= correct_threshold for s in scores) / len(scores)}
    out["eval/reward"] = sum(scores) / len(scores)
    out.update(response_shape(greedy, summaries or []))
    if reward_fn is not None:
        columns = {c: [row[c] for row in picked] for c in picked[0]}
        width = max(r.response_ids.shape[1] for r in greedy)
        # The rollouts' structure, for a function that needs some (`environment_reward`).
        structure, _ = concat_structure(greedy, width)
        total = reward_fn(prompts, texts, columns, structure=structure).total
        out["eval/weighted_reward"] = float(total.mean())
    out.update(grouped_scores(task, picked, scores, correct_threshold))
    out.update(style_shares(task, picked, texts))
    out.update(task.eval_metrics(texts, picked))
    if samples <= 0:
        return out
    texts = sampled
    sampled_scores = verified(
        task,
        [p for p in prompts for _ in range(samples)],
        texts,
        [row for row in picked for _ in range(samples)],
        f"sampled completions ({samples} per row, in row order)",
        limit,
    )
    ks = ks or [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples]
    pass_sums = dict.fromkeys(ks, 0.0)
    avg_sum = maj_sum = distinct_sum = 0.0
    for i in range(len(picked)):
        mine = texts[i * samples : (i + 1) * samples]
        correct = [s >= correct_threshold for s in sampled_scores[i * samples : (i + 1) * samples]]
        c = sum(correct)
        distinct_sum += distinct_correct(task, mine, correct)
        for k in ks:
            pass_sums[k] += pass_at_k(samples, c, k)
        avg_sum += avg_at_k([float(x) for x in correct])
        maj_sum += maj_at_k([task.extract_answer(t) for t in mine], correct)
    n = len(picked)
    out.update({f"eval/pass@{k}": v / n for k, v in pass_sums.items()})
    out[f"eval/avg@{samples}"] = avg_sum / n
    out[f"eval/maj@{samples}"] = maj_sum / n
    out[f"eval/distinct_correct@{samples}"] = distinct_sum / n
    return out


def verified(
    task: Task,
    prompts: list[Any],
    texts: list[str],
    rows: list[dict[str, Any]],
    what: str,
    timeout_s: float | None,
) -> list[float]:
    """The task's reward of each text on its row (None, no reward: 0.0), from one call of
    its verifier as the reward pipeline makes it (`score_reward_function` on
    `task_reward_function`, training's adapter of `Task.verify`): the call gets its own
    copies of the prompts, texts and rows, runs within `timeout_s`, and what it raises or
    returns wrong is a `RewardFunctionError` naming the function and the first sample that
    fails, here prefixed with the held-out `what` (e.g. "greedy completions"), in whose
    order the samples count."""
    columns = {column: [row[column] for row in rows] for column in rows[0]}
    try:
        values = score_reward_function(
            task_reward_function(task), prompts, texts, columns, timeout_s=timeout_s
        )
    except RewardFunctionError as error:  # RewardTimeoutError too: its class is kept
        raise type(error)(f"held-out evaluation of the {what}: {error}") from error
    return [0.0 if v is None else v for v in values]


def verify_time_limit(reward_fn: Callable[..., Any] | None) -> float | None:
    """The time limit of one verifier call: the run pipeline's limit for its `task` function
    (`reward.functions[i].timeout_s`, the same verifier in training) when `reward_fn` has
    one, else the default of an in-process reward call (`isolation.DEFAULT_TIMEOUT_S`)."""
    limits = getattr(reward_fn, "timeouts", None) or {}
    return limits.get("task", isolation.DEFAULT_TIMEOUT_S)


def distinct_correct(task: Task, texts: list[str], correct: list[bool]) -> int:
    """Distinct final answers (`Task.extract_answer`, else the whole text) among the correct
    completions of one problem."""
    return len({task.extract_answer(t) or t for t, ok in zip(texts, correct, strict=True) if ok})


def response_shape(parts: list[Any], summaries: list[ResponseSummary]) -> dict[str, float]:
    """Median response length (tokens, EOS included) and the median of each summary over
    the rollouts of every generation batch in `parts`. Summaries read the rollout-time
    entropies: without them (an engine that does not record them) they are left out."""
    lengths: list[int] = []
    values: dict[str, list[float]] = {name: [] for name, _ in summaries}
    entropies = bool(parts) and all(p.has_entropies for p in parts)
    for rollouts in parts:
        lengths += rollouts.lengths.tolist()
        if entropies and len(rollouts):
            for name, fn in summaries:
                values[name] += fn(rollouts)
    if not lengths:
        return {}
    out = {"eval/response_tokens_median": float(statistics.median(lengths))}
    if entropies:
        out.update({f"eval/{k}_median": float(statistics.median(v)) for k, v in values.items()})
    return out


def _generate(
    engine: RolloutEngine,
    tokenizer: Any,
    ids: list[list[int]],
    params: SamplingParams,
    done: Callable[[int], None],
    generate: Generate | None = None,
    rows: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[list[str], list[Any]]:
    """Decoded completions of `ids` and the rollouts of each batch, generated in the
    engine's own batches (so the results are those of one call) and reported batch by
    batch to `done`; by `generate` when given (`EvalSettings.generate`), which gets the
    data row of each prompt (`rows`, aligned with `ids`)."""
    step = getattr(engine, "batch_size", None) or len(ids) or 1
    texts: list[str] = []
    parts: list[Any] = []
    for start in range(0, len(ids), step):
        part = ids[start : start + step]
        if generate is None:
            rollouts = engine.generate(part, params)
        else:
            part_rows = None if rows is None else rows[start : start + step]
            rollouts = generate(engine, part, params, rows=part_rows)
        texts += decode(tokenizer, rollouts)
        parts.append(rollouts)
        done(len(part))
    return texts, parts


def eval_rows(task: Task, size: int) -> datasets.Dataset:
    rows = task.rows("eval")
    return rows.select(range(min(size, len(rows)))) if size else rows


def style_shares(task: Task, rows: list[dict[str, Any]], texts: list[str]) -> dict[str, float]:
    """Share of greedy answers of each of the task's `styles` (`Task.output_style`), overall
    (`eval/style/<s>`) and per value of the `eval_group_column` (`eval/<group>/style/<s>`);
    {} for a task without styles."""
    if not task.styles:
        return {}
    styles = [task.output_style(t, row) for t, row in zip(texts, rows, strict=True)]
    unknown = sorted({str(s) for s in styles} - set(task.styles))
    if unknown:
        raise ValueError(f"task {task.name!r}: output styles {unknown} not in {task.styles}")
    groups: dict[str, list[str | None]] = {"": styles}
    column = task.eval_group_column
    if column is not None:
        for row, style in zip(rows, styles, strict=True):
            groups.setdefault(f"{column}_{row[column]}/", []).append(style)
    return {
        f"eval/{name}style/{kind}": members.count(kind) / len(members)
        for name, members in sorted(groups.items())
        for kind in task.styles
    }


def grouped_scores(
    task: Task, rows: list[dict[str, Any]], scores: list[float], correct_threshold: float
) -> dict[str, float]:
    """Greedy accuracy (reward >= `correct_threshold`) and mean reward per value of the
    task's `eval_group_column`."""
    column = task.eval_group_column
    if column is None:
        return {}
    groups: dict[str, list[float]] = {}
    for row, score in zip(rows, scores, strict=True):
        groups.setdefault(f"{column}_{row[column]}", []).append(score)
    out: dict[str, float] = {}
    for name, values in sorted(groups.items()):
        out[f"eval/{name}/accuracy"] = sum(v >= correct_threshold for v in values) / len(values)
        out[f"eval/{name}/reward"] = sum(values) / len(values)
    return out
