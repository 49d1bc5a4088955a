"""The parts of a run, resolved from its config once: `build_parts(config) -> Parts`.

Every registry name a config gives is looked up and bound to its options here, and
the config was checked once before (`policyopt.config.check`: `load_config` checks what it
loads; `build_parts` checks a config only if it was not, or changed since). The step
(`policyopt.train.step`) then calls the bound parts and never reads the config.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from policyopt.config.check import ensure_checked, loss_settings
from policyopt.config.schema import Config
from policyopt.core.filters import GROUP_FILTERS
from policyopt.rewards.functions import RewardPipeline, build_reward_pipeline
from policyopt.rewards.shaping import SHAPERS, RewardShaper
from policyopt.rollout.base import ENGINES, RolloutEngine, SamplingParams
from policyopt.rollout.strategies import ROLLOUT_ANNOTATORS, ROLLOUT_STRATEGIES
from policyopt.tasks.base import Task, get_task
from policyopt.train.held_out import EvalSettings, ResponseSummary
from policyopt.train.update import BoundLoss


@dataclass(frozen=True)
class Part:
    """A registered part (`kind` of registry, `name` in it) bound to its options."""

    kind: str
    name: str
    fn: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)

    label: str = field(init=False)  # how errors name it: "reward shaper 'gar'"

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", f"{self.kind} {self.name!r}")


@dataclass
class Parts:
    """A run's parts in the order the step calls them (plug points 1-5 of DESIGN.md)."""

    task: Task
    make_engine: Callable[[torch.nn.Module, Any], RolloutEngine]  # (model, tokenizer)
    # 1. rollout: the strategy (options bound) and annotators, with their sampling settings
    strategy: Part
    annotators: list[Part]
    sampling: SamplingParams
    group_size: int
    chat_template: bool
    staleness: int  # train on the batch sampled this many steps earlier (train/step.py)
    # 2. rewards: the verifier pipeline, the task function's name and weight, the shapers
    reward: RewardPipeline
    task_function: str
    task_weight: float
    correct_threshold: float
    prefetch: bool
    shapers: list[tuple[Part, RewardShaper]]
    # 3. group filters; dynamic sampling: up to `max_rounds` rounds, the batch cut to target
    filters: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
    max_rounds: int
    dynamic_sampling: bool
    # 4. the advantage estimator; DAPO's overlong filtering of the loss mask
    advantage: Part
    filter_truncated: bool
    # 5. the policy loss (with its KL term)
    loss: BoundLoss
    # Held-out evaluation, as the config says (trainer, `policyopt eval`)
    evaluation: EvalSettings
    # What shapers are told of the run
    total_steps: int
    logit_chunk_size: int
    max_new_tokens: int


def build_parts(config: Config) -> Parts:
    """The checked config's parts, each resolved once and bound to its options. The task is
    built here (its rows and verifier); the engine needs the model: `make_engine`."""
    ensure_checked(config)
    ro, rw, alg = config.rollout, config.reward, config.algorithm
    task = get_task(config.task.name, **config.task.options)
    reward = build_reward_pipeline(
        [(f.name, f.weight) for f in rw.functions],
        task,
        remote={f.name: rw.workers.model_dump() for f in rw.functions if f.remote},
        timeouts={f.name: f.timeout_s for f in rw.functions if f.timeout_s is not None},
    )
    task_name = task_function(config)
    filters = []
    if alg.dynamic_sampling:
        filters.append(GROUP_FILTERS.get("nonconstant"))
    if alg.group_filter is not None:
        filters.append(GROUP_FILTERS.get(alg.group_filter))
    shapers = []
    for s in rw.shapers:
        part = Part("reward shaper", s.name, SHAPERS.get(s.name), dict(s.options))
        shapers.append((part, part.fn(**part.options)))
    return Parts(
        task=task,
        make_engine=partial(_engine, ENGINES.get(ro.engine), ro.batch_size, ro.engine_options),
        strategy=Part(
            "rollout strategy",
            ro.strategy,
            ROLLOUT_STRATEGIES.get(ro.strategy),
            dict(ro.strategy_options),
        ),
        annotators=[
            Part("rollout annotator", a.name, ROLLOUT_ANNOTATORS.get(a.name), dict(a.options))
            for a in ro.annotators
        ],
        sampling=SamplingParams(
            max_new_tokens=ro.max_new_tokens,
            temperature=ro.temperature,
            top_p=ro.top_p,
            with_hidden=needs_hidden(config),
        ),
        group_size=ro.group_size,
        chat_template=config.model.chat_template,
        staleness=ro.staleness,
        reward=reward,
        task_function=task_name,
        task_weight=next(w for name, _, w in reward.functions if name == task_name),
        correct_threshold=rw.correct_threshold,
        prefetch=reward.can_prefetch and prefetch_enabled(config),
        shapers=shapers,
        filters=filters,
        max_rounds=alg.max_sampling_rounds if alg.dynamic_sampling else 1,
        dynamic_sampling=alg.dynamic_sampling,
        advantage=Part(
            "advantage estimator",
            alg.advantage,
            _advantage_fn(alg.advantage),
            dict(alg.advantage_options),
        ),
        filter_truncated=alg.filter_truncated,
        loss=bound_loss(config),
        evaluation=eval_settings(config),
        total_steps=config.train.steps,
        logit_chunk_size=config.model.logit_chunk_size,
        max_new_tokens=ro.max_new_tokens,
    )


def eval_settings(config: Config) -> EvalSettings:
    """Held-out evaluation's settings from `eval`, `rollout`, `model` and `reward`."""
    ev = config.eval
    return EvalSettings(
        size=ev.size,
        max_new_tokens=ev.max_new_tokens or config.rollout.max_new_tokens,
        samples=ev.samples,
        temperature=ev.temperature,
        chat=config.model.chat_template,
        correct_threshold=config.reward.correct_threshold,
        progress=config.train.progress,
        summaries=response_summaries(config),
        generate=held_out_generation(config),
    )


def held_out_generation(config: Config) -> Callable[..., Any] | None:
    """How held-out evaluation samples, for a strategy that declares it (`held_out`: the
    `multi_turn` strategy plays episodes with the run's environment), with the run's
    strategy options; None: the engine's own `generate`."""
    fn = getattr(ROLLOUT_STRATEGIES.get(config.rollout.strategy), "held_out", None)
    return None if fn is None else partial(fn, **config.rollout.strategy_options)


def response_summaries(config: Config) -> list[ResponseSummary]:
    """Every registered annotator that declares an `eval_summary` (name, fn) summarises the
    greedy responses, with the run's options for it if the run uses it, else its defaults."""
    configured = {a.name: dict(a.options) for a in config.rollout.annotators}
    out: list[ResponseSummary] = []
    for name in ROLLOUT_ANNOTATORS.loaded():
        declared = getattr(ROLLOUT_ANNOTATORS.get(name), "eval_summary", None)
        if declared is not None:
            label, fn = declared
            out.append((label, partial(fn, **configured.get(name, {}))))
    return out


def bound_loss(config: Config) -> BoundLoss:
    """The configured policy loss with its options (clip range and agg where it takes them,
    then `algorithm.loss_options`) and KL term."""
    from policyopt.core import POLICY_LOSSES

    alg = config.algorithm
    options = loss_settings(config)
    return BoundLoss(
        name=alg.loss,
        fn=POLICY_LOSSES.get(alg.loss),
        options={**options, **alg.loss_options},
        max_len=config.rollout.max_new_tokens,
        kl_coef=alg.kl_coef,
        kl_estimator=alg.kl_estimator,
    )


def task_function(config: Config) -> str:
    """The reward function whose value is the task reward M: `reward.task_function`, else
    the one named "task", else the first."""
    names = [f.name for f in config.reward.functions]
    if config.reward.task_function is not None:
        return config.reward.task_function
    return "task" if "task" in names else names[0]


def prefetch_enabled(config: Config) -> bool:
    """`reward.prefetch`, with "auto" resolved: on when sampling leaves a CPU core free (the
    model is on an accelerator, or torch uses fewer threads than this process has cores)."""
    if config.reward.prefetch != "auto":
        return bool(config.reward.prefetch)
    if not config.model.device.startswith("cpu"):
        return True
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return torch.get_num_threads() < cores


def needs_hidden(config: Config) -> bool:
    """Shapers that read the policy's hidden states (GAR) ask the engine to keep them, by
    a `needs_hidden = True` attribute on their factory."""
    return any(getattr(SHAPERS.get(s.name), "needs_hidden", False) for s in config.reward.shapers)


def _engine(
    factory: Callable[..., RolloutEngine],
    batch_size: int,
    options: dict[str, Any],
    model: torch.nn.Module,
    tokenizer: Any,
) -> RolloutEngine:
    return factory(model, tokenizer, batch_size=batch_size, **options)


def _advantage_fn(name: str) -> Callable[..., Any]:
    from policyopt.core import ADVANTAGES

    return ADVANTAGES.get(name)
