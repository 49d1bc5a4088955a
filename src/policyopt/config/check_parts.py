"""The config's registered parts, checked at load: names exist, options are ones they take.

Every name a config gives (rollout engine and strategy, annotators, reward functions and
shapers, group filter, advantage estimator, policy loss, KL estimator, aggregation mode,
task) must be registered, and every option under it must be a keyword parameter of the
registered callable (or factory), of the type its annotation declares. A mistake is reported
with its config key and the nearest valid name, before any model is loaded, instead of as a
TypeError at the first step. Options are only checked, never converted: the part receives
what the user wrote.

A part that takes `**options` declares the names it accepts in an `option_names` attribute
(otherwise anything is accepted). Parameters that the run supplies are not options: leading
data arguments (`skip`), values the trainer passes (`SUPPLIED`), tensors (per-token
structure from the rollouts) and the structure a part declares it needs
(`policyopt.core.structure`).
"""

from __future__ import annotations

import difflib
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from policyopt.core.registry import unknown_name_message
from policyopt.core.structure import needs_of, optional_needs_of

if TYPE_CHECKING:
    from policyopt.config.schema import Config

# Keyword parameters the trainer fills itself, per plug point: name -> where it comes from.
STRATEGY_SUPPLIED = {
    "group_size": "rollout.group_size",
    "score": "the trainer (the verifier)",
    "on_finished": "the trainer (reward prefetch)",
    "rows": "the trainer (the prompts' data rows)",
}
LOSS_SUPPLIED = {
    "agg": "algorithm.agg",
    "clip_low": "algorithm.clip_low",
    "clip_high": "algorithm.clip_high",
}


def check_parts(config: Config) -> list[str]:
    """Every problem with the config's registered names and their options (empty: none)."""
    import policyopt.methods  # noqa: F401  (methods register their parts)
    from policyopt.core import ADVANTAGES, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES
    from policyopt.core.advantages import is_group_relative
    from policyopt.core.filters import GROUP_FILTERS
    from policyopt.rewards.shaping import SHAPERS
    from policyopt.rollout import ENGINES, ROLLOUT_ANNOTATORS, ROLLOUT_STRATEGIES
    from policyopt.tasks import TASKS

    problems: list[str] = []
    ro, alg = config.rollout, config.algorithm
    engine = named(problems, "rollout.engine", ENGINES, ro.engine)
    if engine is not None:
        what = f"rollout engine {ro.engine!r}"
        supplied = {"batch_size": "rollout.batch_size"}
        options(problems, "rollout.engine_options", what, engine, ro.engine_options, 2, supplied)
    strategy = named(problems, "rollout.strategy", ROLLOUT_STRATEGIES, ro.strategy)
    if strategy is not None:
        options(
            problems,
            "rollout.strategy_options",
            f"rollout strategy {ro.strategy!r}",
            strategy,
            ro.strategy_options,
            skip=3,
            supplied=STRATEGY_SUPPLIED,
        )
    for i, a in enumerate(ro.annotators):
        fn = named(problems, f"rollout.annotators.{i}.name", ROLLOUT_ANNOTATORS, a.name)
        if fn is not None:
            where = f"rollout.annotators.{i}.options"
            options(problems, where, f"rollout annotator {a.name!r}", fn, a.options, skip=1)
    for i, f in enumerate(config.reward.functions):
        reward_function(problems, f"reward.functions.{i}.name", f.name)
    for i, s in enumerate(config.reward.shapers):
        factory = named(problems, f"reward.shapers.{i}.name", SHAPERS, s.name)
        if factory is not None:
            where = f"reward.shapers.{i}.options"
            options(problems, where, f"reward shaper {s.name!r}", factory, s.options)
    if alg.group_filter is not None:
        named(problems, "algorithm.group_filter", GROUP_FILTERS, alg.group_filter)
    estimator = named(problems, "algorithm.advantage", ADVANTAGES, alg.advantage)
    if estimator is not None:
        what = f"advantage estimator {alg.advantage!r}"
        options(problems, "algorithm.advantage_options", what, estimator, alg.advantage_options, 2)
    group_relative = estimator is not None and is_group_relative(estimator, alg.advantage_options)
    if ro.group_size == 1 and group_relative and ro.strategy == "parallel":
        problems.append(
            f"rollout.group_size: 1, but advantage {alg.advantage!r} compares the samples of "
            "one prompt with each other: with one sample every advantage is 0 and nothing is "
            "learned; give 2 or more (TRL's GRPOTrainer refuses it too)"
        )
    loss = named(problems, "algorithm.loss", POLICY_LOSSES, alg.loss)
    if loss is not None:
        options(
            problems,
            "algorithm.loss_options",
            f"policy loss {alg.loss!r}",
            loss,
            alg.loss_options,
            skip=1,
            supplied=LOSS_SUPPLIED,
        )
    named(problems, "algorithm.kl_estimator", KL_ESTIMATORS, alg.kl_estimator)
    if alg.agg is not None and alg.agg not in AGG_MODES:  # None: the loss's own default
        problems.append(unknown("algorithm.agg", "aggregation mode", alg.agg, list(AGG_MODES)))
    task = named(problems, "task.name", TASKS, config.task.name)
    if task is not None:
        options(problems, "task.options", f"task {config.task.name!r}", task, config.task.options)
    return problems


def named(problems: list[str], where: str, registry: Any, name: str) -> Any:
    """The registered entry `name`, or None after recording the problem."""
    if name in registry:
        return registry.get(name)
    problems.append(unknown(where, registry.kind, name, registry.names()))
    return None


def unknown(where: str, kind: str, name: str, valid: list[str]) -> str:
    return f"{where}: {unknown_name_message(kind, str(name), valid)}"


def reward_function(problems: list[str], where: str, spec: str) -> None:
    """`task`, a registered name, or `module.path:function` that imports."""
    from policyopt.rewards.functions import REWARD_FUNCTIONS, load_reward_function

    if spec == "task":
        return
    if ":" not in spec:
        if spec not in REWARD_FUNCTIONS:
            valid = ["task", *REWARD_FUNCTIONS.names()]
            problems.append(
                unknown(where, "reward function", spec, valid) + "; or give 'module.path:function'"
            )
        return
    try:
        load_reward_function(spec)
    except ValueError as err:
        problems.append(f"{where}: {err}")


def options(
    problems: list[str],
    where: str,
    what: str,
    fn: Callable[..., Any],
    given: Mapping[str, Any],
    skip: int = 0,
    supplied: Mapping[str, str] | None = None,
) -> None:
    """Record each option of `given` that `fn` does not take, or takes with another type,
    and each required parameter that is missing."""
    supplied = supplied or {}
    try:
        params = list(inspect.signature(fn).parameters.values())[skip:]
    except (TypeError, ValueError):  # no signature to check against (a builtin)
        return
    hints = type_hints(fn)
    structure = (
        set(needs_of(fn))
        | set(optional_needs_of(fn))
        | {p.name for p in params if is_tensor(hints.get(p.name))}
    )
    keyword = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in supplied
        and p.name not in structure
    ]
    declared = getattr(fn, "option_names", None)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params) and declared is None
    valid = list(declared) if declared is not None else [p.name for p in keyword]
    for key, value in given.items():
        at = f"{where}.{key}"
        if key in supplied:
            problems.append(f"{at}: {what} receives '{key}' from {supplied[key]}, not an option")
        elif key in structure:
            problems.append(
                f"{at}: {what} receives '{key}' from the run (structure a part produces), "
                "not an option to set"
            )
        elif key not in valid and not takes_any:
            if not valid:
                problems.append(f"{at}: {what} takes no options")
                continue
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            problems.append(f"{at}: unknown option of {what}{hint} (valid: {', '.join(valid)})")
        elif key in hints:
            bad = type_problem(hints[key], value)
            if bad:
                problems.append(f"{at}: {bad} for {what} (got {value!r})")
    for p in keyword:
        if p.default is p.empty and p.name not in given:
            problems.append(f"{where}: {what} needs option '{p.name}'")


def type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolved annotations of `fn` (of `__init__` for a class); {} where they do not resolve."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    try:
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - a name only imported for type checking: skip types
        return {}


def is_tensor(annotation: Any) -> bool:
    """Whether an annotation mentions torch.Tensor (per-token structure, never a config value)."""
    import torch

    if annotation is torch.Tensor:
        return True
    return any(is_tensor(a) for a in typing.get_args(annotation))


_ANY_TYPE = ConfigDict(arbitrary_types_allowed=True)


def type_problem(annotation: Any, value: Any) -> str | None:
    """Pydantic's (lax) verdict on `value` for `annotation`; None when it fits or cannot be
    checked."""
    try:
        adapter = TypeAdapter(annotation, config=_ANY_TYPE)
    except Exception:  # noqa: BLE001 - an annotation pydantic cannot build a schema for
        return None
    try:
        adapter.validate_python(value)
    except ValidationError as err:
        first = err.errors()[0]
        return f"{first['msg']} (expected {type_name(annotation)})"
    return None


def type_name(annotation: Any) -> str:
    """`int`, `Sequence[str]`, `float | None`: the annotation as written."""
    if not typing.get_args(annotation) and hasattr(annotation, "__name__"):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("collections.abc.", "")
