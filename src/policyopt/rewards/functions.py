"""Reward functions and the pipeline that combines them.

A reward function has TRL's signature and is called the way TRL's `GRPOTrainer` calls it,

    f(prompts=[...], completions=[...], completion_ids=[[...], ...], trainer_state=state,
      **columns) -> list[float | None]

by keyword: every dataset column arrives as a keyword list aligned with `completions`, so
the function must accept **kwargs for what it does not use (TRL's `def reward_len(
completions, **kwargs)` works unchanged). `completion_ids` (token ids of each completion)
is passed when the caller has them; `trainer_state.global_step` / `.max_steps` say where
training is. A function whose first two parameters have other names is called positionally.
None (or NaN, which TRL makes of None) means "no reward for this sample": the pipeline
scores it 0 in the weighted sum (TRL's nansum) and counts it as unparseable, never crashes
on it. Anything else that is not a number (a string, a generator, None for the whole batch)
is an error naming the function and the sample.

A function may instead return a `RewardOutput(rewards, structure)`: `structure` holds values
for later parts of the step (SRPO's distances between a group's rankings, DRPO's control
rewards), each per completion [n] or pairwise [n, n] over the call's n completions, under
names the function declares with `@produces(...)` (`policyopt.core.structure`). They join
the step's `Rollouts.structure`, where a part that `@needs` them finds them. Plain lists keep
working (TRL compatibility).

A function may also take structure an earlier part made (the rollout strategy's, such as
`multi_turn`'s `environment_reward`): it declares `@needs(name)` and receives it by keyword,
as a column is passed, one entry per completion (`tensor.tolist()`); a config without the
part that makes it is refused at load (`policyopt.config.structure_check`).

Conversational prompts (TRL's format: a prompt that is a list of `{"role", "content"}`
messages) are handed to reward functions as those messages, and their completions as
`[{"role": "assistant", "content": text}]`, as TRL's `GRPOTrainer` does; the registered
functions and the task verifier read the text either way (`completion_text`).

Every call of a reward function goes through one path (`_score`, used by the pipeline and by
`score_reward_function`): the call gets its own copies of the prompts, completions, columns
and extra arguments, so that what it edits reaches no other function and not the logged
samples; a function that raises, including `sys.exit()`, is a `RewardFunctionError` naming
it and the first sample that fails alone; a call that does not return within its time limit
(`policyopt.rewards.isolation`) is a `RewardTimeoutError`.

Named functions live in `REWARD_FUNCTIONS`; `load_reward_function` also takes
`module.path:function`. `task_reward_function` adapts a task's `verify`. Registered here:
`environment_reward`, the reward a multi-turn episode's environment ended it with.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from policyopt.core.registry import Registry, unknown_name_message
from policyopt.core.structure import (
    check_declared_made,
    check_produced,
    gather,
    needs,
    needs_of,
    optional_needs_of,
)
from policyopt.core.user_code import import_user_code
from policyopt.rewards import isolation
from policyopt.rewards.calling import (
    EXTRA_ARGUMENTS,
    Call,
    completion_text,
    keyword_style,
    own_inputs,
)


class Verifier(Protocol):
    """What the `task` reward function needs of a task (`policyopt.tasks.base.Task` is one)."""

    name: str

    def verify(self, completion: str, row: dict[str, Any]) -> float | None: ...


logger = logging.getLogger(__name__)

RewardFunction = Callable[..., Sequence[float | None]]
REWARD_FUNCTIONS: Registry[RewardFunction] = Registry("reward function")


class RewardFunctionError(RuntimeError):
    """A reward function raised, or returned something other than one number per sample."""


class RewardTimeoutError(RewardFunctionError):
    """A reward function call did not return within its time limit."""


@dataclass
class RewardTrainerState:
    """What TRL's `trainer_state` gives reward functions that we have: the step (the trainer
    sets it before each step) and the run's length."""

    global_step: int = 0
    max_steps: int = 0


_DEFAULT = object()


def score_reward_function(
    fn: Callable[..., Any],
    prompts: list[Any],
    completions: list[str],
    columns: dict[str, list],
    *,
    name: str | None = None,
    timeout_s: Any = _DEFAULT,
) -> list[float | None]:
    """`fn`'s checked values on a batch, through the pipeline's own call path: copies of the
    inputs, a named error for anything raised (`sys.exit` included) or returned wrong, and a
    time limit (`timeout_s`; default: the function's `time_limit_s`, else
    `isolation.DEFAULT_TIMEOUT_S`; None for none)."""
    name = name or getattr(fn, "__name__", None) or repr(fn)
    if timeout_s is _DEFAULT:
        timeout_s = getattr(fn, "time_limit_s", isolation.DEFAULT_TIMEOUT_S)
    call = Call(fn, *keyword_style(fn), {})
    values, _ = _score(name, call, prompts, completions, columns, timeout_s)
    return values


@dataclass
class RewardOutput:
    """What a reward function may return instead of a plain list: the rewards, and declared
    structure (name -> per-completion list or tensor [n], or pairwise [n, n])."""

    rewards: Sequence[float | None]
    structure: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Registered functions


@REWARD_FUNCTIONS.register("environment_reward")
@needs("environment_reward")
def environment_reward(
    completions: list[Any], environment_reward: list[float], **kwargs: Any
) -> list[float | None]:
    """The reward the environment ended each episode with (`Reply(done=True, reward=r)`,
    rollout strategy `multi_turn`); None (no reward: scored 0 and counted unparseable) for
    an episode it ended without one or a budget (`max_turns`, the token budget) cut first."""
    del completions, kwargs  # the environment scored the episode; nothing else is read
    return [None if math.isnan(r) else float(r) for r in environment_reward]


# ---------------------------------------------------------------------------------------
# Lookup and adaptation


def load_reward_function(spec: str) -> RewardFunction:
    """A registered name (see `REWARD_FUNCTIONS.names()`) or `module.path:function`."""
    registered = REWARD_FUNCTIONS.names()
    if ":" not in spec:
        if spec in REWARD_FUNCTIONS:
            return REWARD_FUNCTIONS.get(spec)
        raise ValueError(
            unknown_name_message("reward function", spec, registered)
            + "; or give 'module.path:function'"
        )
    module_name, _, attribute = spec.partition(":")
    try:
        # through the gate: code a foreign run's config names is refused here (principle 1)
        module = import_user_code(module_name, f"module {module_name!r} (reward function {spec!r})")
    except SyntaxError as error:
        raise ValueError(
            f"reward function {spec!r}: module {module_name!r} does not compile: {error.msg} "
            f"({error.filename} line {error.lineno})"
        ) from error
    except ImportError as error:
        raise ValueError(
            f"reward function {spec!r}: cannot import module {module_name!r} ({error}); "
            f"registered names: {', '.join(registered)}"
        ) from error
    fn = getattr(module, attribute, None)
    if fn is None:
        # The module's own public functions (what the user meant to name), nearest first.
        own = sorted(
            name
            for name, value in vars(module).items()
            if callable(value)
            and not name.startswith("_")
            and getattr(value, "__module__", None) == module.__name__
        )
        hint = unknown_name_message("function", attribute, own).split(";", 1)[1].strip()
        hint = hint.replace("valid names:", "its functions:") if own else "it defines none"
        raise ValueError(
            f"reward function {spec!r}: module {module_name!r} has no function {attribute!r}; "
            f"{hint}"
        )
    if not callable(fn):
        raise ValueError(f"reward function {spec!r} is not callable (it is a {type(fn).__name__})")
    return fn


def task_reward_function(task: Verifier) -> RewardFunction:
    """`task.verify` with TRL's signature: row i is `{column: values[i]}` of the columns.

    Keyword arguments that are not lists (TRL also passes `trainer_state`, `log_metric`,
    ...) are not columns and are ignored.
    """

    def verify(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float | None]:
        columns = {
            k: v
            for k, v in kwargs.items()
            if isinstance(v, list | tuple) and k not in EXTRA_ARGUMENTS
        }
        for column, values in columns.items():
            if len(values) != len(completions):
                raise ValueError(
                    f"column {column!r} has {len(values)} values for {len(completions)} completions"
                )
        return [
            task.verify(
                completion_text(completion),
                {column: values[i] for column, values in columns.items()},
            )
            for i, completion in enumerate(completions)
        ]

    verify.__name__ = f"{task.name}_verify"
    return verify


# ---------------------------------------------------------------------------------------
# Pipeline


@dataclass
class RewardResult:
    """Rewards of one batch.

    total: Σ_f w_f r_f per sample, unparseable values counted as 0; shape [N], float32.
    weighted: each function's term w_f r_f of that sum ([N], float32; None -> 0).
    raw: each function's values as returned (None kept).
    unparseable: each function's number of None values.
    """

    total: torch.Tensor
    weighted: dict[str, torch.Tensor]
    raw: dict[str, list[float | None]]
    unparseable: dict[str, int]
    # Declared structure the functions returned (`RewardOutput`): [N] or pairwise [N, N].
    structure: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def pairwise(self) -> set[str]:
        return {k for k, v in self.structure.items() if v.dim() == 2}


class RewardPipeline:
    """Weighted sum of named reward functions: total_i = Σ_f w_f r_f(i), None -> 0."""

    def __init__(
        self,
        functions: list[tuple[str, RewardFunction, float]],
        timeouts: dict[str, float | None] | None = None,
    ) -> None:
        """`timeouts`: the time limit of one call of a named function, in seconds (None for
        none); a function not named has its own `time_limit_s` attribute, else
        `isolation.DEFAULT_TIMEOUT_S` (a remote pool: none, its chunks have their own)."""
        if not functions:
            raise ValueError("a reward pipeline needs at least one reward function")
        names = [name for name, _, _ in functions]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"reward function names must be unique, repeated: {duplicated}")
        for name, fn, weight in functions:
            if not callable(fn):
                raise ValueError(
                    f"reward function {name!r} is not callable (it is a {type(fn).__name__})"
                )
            if not math.isfinite(weight):
                raise ValueError(f"reward function {name!r} has a non-finite weight {weight}")
        self.functions = [(name, fn, float(weight)) for name, fn, weight in functions]
        self._styles = {name: keyword_style(fn) for name, fn, _ in functions}
        self.timeouts = _time_limits(self.functions, timeouts or {})
        # TRL's `trainer_state` as reward functions see it; the trainer moves global_step.
        self.trainer_state = RewardTrainerState()

    def __call__(
        self,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, list],
        *,
        completion_ids: list[list[int]] | None = None,
        structure: Mapping[str, torch.Tensor] | None = None,
    ) -> RewardResult:
        """Score a batch. `structure`: the rollouts' declared structure, of which each
        function that `@needs` a name gets that value by keyword, one entry per completion;
        a needed name that is not there is a `MissingStructureError` naming the function."""
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} completions")
        if completion_ids is not None and len(completion_ids) != n:
            raise ValueError(f"{len(completion_ids)} completion_ids for {n} completions")
        for column, values in columns.items():
            if column in ("prompts", "completions", *EXTRA_ARGUMENTS):
                raise ValueError(f"column name {column!r} clashes with a reward-function argument")
            if len(values) != n:
                raise ValueError(f"column {column!r} has {len(values)} values for {n} completions")
        total = torch.zeros(n, dtype=torch.float32)
        weighted: dict[str, torch.Tensor] = {}
        raw: dict[str, list[float | None]] = {}
        unparseable: dict[str, int] = {}
        # What earlier parts made (the strategy's, the annotators'), for functions that
        # need it; `produced` gathers what the functions make, each in turn.
        available = dict(structure or {})
        produced: dict[str, torch.Tensor] = {}
        extra: dict[str, Any] = {"trainer_state": self.trainer_state}
        if completion_ids is not None:
            extra["completion_ids"] = completion_ids
        for name, fn, weight in self.functions:
            call = Call(fn, *self._styles[name], extra)
            given = {**columns, **_needed(name, fn, {**available, **produced}, columns, n)}
            values, made = _score(name, call, prompts, completions, given, self.timeouts[name])
            clash = sorted(set(made) & set(produced))
            if clash:
                raise RewardFunctionError(
                    f"reward function {name!r} produces {clash}, which another function "
                    "of the pipeline already produced"
                )
            produced.update(made)
            raw[name] = values
            unparseable[name] = sum(v is None for v in values)
            weighted[name] = weight * torch.tensor(
                [0.0 if v is None else v for v in values], dtype=torch.float32
            )
            total += weighted[name]
            if unparseable[name]:
                logger.debug(
                    "reward %r: %d of %d completions unparseable (scored 0)",
                    name,
                    unparseable[name],
                    n,
                )
        return RewardResult(
            total=total, weighted=weighted, raw=raw, unparseable=unparseable, structure=produced
        )

    def close(self) -> None:
        """Release what functions hold (a Ray pool's workers)."""
        for _, fn, _ in self.functions:
            close = getattr(fn, "close", None)
            if callable(close):
                close()

    @property
    def can_prefetch(self) -> bool:
        """Whether any function can start on completions early (`prefetch`)."""
        return any(hasattr(fn, "prefetch") for _, fn, _ in self.functions)

    def prefetch(
        self, prompts: list[str], completions: list[str], columns: dict[str, list]
    ) -> None:
        """Hand finished completions to the functions that can start on them early (those
        with a `prefetch(prompts, completions, **columns)` attribute, e.g. the DocPO formula
        reward); a hint that changes no value. Errors are left for the real call to raise."""
        for _, fn, _ in self.functions:
            start = getattr(fn, "prefetch", None)
            if start is None:
                continue
            try:
                # The inputs the call will get, so that what is started early is what the
                # call asks for (a pool keys its results by them).
                own_prompts, own_completions, own_columns = own_inputs(
                    prompts, completions, columns
                )
                start(own_prompts, own_completions, **own_columns)
            except Exception:  # noqa: S112 - __call__ reports it with the sample that fails
                continue


def _needed(
    name: str,
    fn: RewardFunction,
    structure: Mapping[str, torch.Tensor],
    columns: dict[str, list],
    n: int,
) -> dict[str, list]:
    """The structure `fn` declares it needs, as keyword lists aligned with the completions
    (passed, copied and split per sample as the columns are)."""
    wanted = gather(f"reward function {name!r}", fn, structure)
    out = {}
    for key, value in wanted.items():
        if key in columns:
            raise ValueError(
                f"column {key!r} clashes with the structure {key!r} that reward function "
                f"{name!r} needs"
            )
        if len(value) != n:
            raise ValueError(
                f"reward function {name!r} needs {key!r}, which has {len(value)} values for "
                f"{n} completions"
            )
        out[key] = value.tolist()
    return out


def _time_limits(
    functions: list[tuple[str, RewardFunction, float]], given: dict[str, float | None]
) -> dict[str, float | None]:
    names = [name for name, _, _ in functions]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(
            f"time limits for unknown reward functions: {', '.join(map(repr, unknown))} "
            f"(functions: {', '.join(names)})"
        )
    limits = {
        name: given[name]
        if name in given
        else getattr(fn, "time_limit_s", isolation.DEFAULT_TIMEOUT_S)
        for name, fn, _ in functions
    }
    for name, limit in limits.items():
        if limit is not None and not (isinstance(limit, int | float) and limit > 0):
            raise ValueError(
                f"the time limit of reward function {name!r} must be > 0 seconds or None, "
                f"got {limit!r}"
            )
    return limits


def _limited(name: str, timeout_s: float | None, call: Callable[[], Any]) -> Any:
    """`call()` within the function's time limit; past it, a `RewardTimeoutError`."""
    try:
        return isolation.call_with_time_limit(call, timeout_s, f"reward function {name!r}")
    except isolation.TimeLimitExceeded as late:
        what = (
            "it was stopped"
            if late.stopped
            else "it runs on in a thread that cannot be stopped, so the run must end"
        )
        raise RewardTimeoutError(
            f"reward function {name!r} did not return within {late.timeout_s:g} s (its time "
            f"limit per call); {what}. A slow function can set a longer limit, or run in "
            "Ray workers (remote: true), where a hung call scores 0 and its worker is replaced"
        ) from None


def _score(
    name: str,
    fn: Call,
    prompts: list[Any],
    completions: list[str],
    columns: dict[str, list],
    timeout_s: float | None,
) -> tuple[list[float | None], dict[str, torch.Tensor]]:
    """Call `fn` on the batch; on an exception, find the first sample that fails alone.
    Returns the values and the declared structure the function returned. SystemExit is an
    exception of the function like any other (a reward must not end the run, with status 0
    and no checkpoint); KeyboardInterrupt is the user's and passes."""
    try:
        output = _limited(name, timeout_s, lambda: fn(prompts, completions, **columns))
    except RewardTimeoutError:
        raise  # the batch never ended: scoring each sample would only wait again
    except (Exception, SystemExit) as error:
        for i, completion in enumerate(completions):
            row = {key: [vals[i]] for key, vals in columns.items()}
            try:
                _limited(
                    name,
                    timeout_s,
                    lambda i=i, c=completion, row=row: fn([prompts[i]], [c], **row, _sample=i),
                )
            except RewardTimeoutError:
                raise
            except (Exception, SystemExit) as sample_error:
                raise RewardFunctionError(
                    f"reward function {name!r} failed on sample {i} "
                    f"(completion {completion[:80]!r}): {sample_error!r}"
                    f"{_where(sample_error)}"
                ) from sample_error
        raise RewardFunctionError(
            f"reward function {name!r} failed on the batch of {len(completions)} "
            f"(no single sample fails alone): {error!r}{_where(error)}"
        ) from error
    n = len(completions)
    structure = {}
    if isinstance(output, RewardOutput):
        output, structure = output.rewards, output.structure
    if isinstance(output, torch.Tensor):
        output = output.tolist()
    elif type(output).__module__ == "numpy":
        if getattr(output, "ndim", None) == 0:  # a numpy scalar or 0-d array: one number
            raise RewardFunctionError(
                f"reward function {name!r} returned a 0-d numpy array ({output.item()!r}: one "
                f"number), not a list of {n} numbers (one per completion)"
            )
        output = list(output)
    if not isinstance(output, list | tuple):
        raise RewardFunctionError(
            f"reward function {name!r} returned {_kind(output)}, not a list of "
            f"{n} numbers (one per completion; None for no reward)"
        )
    values = list(output)
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} values for {n} completions"
        )
    return [_as_reward(name, i, v) for i, v in enumerate(values)], _as_structure(
        name, fn.fn, structure, n
    )


def _where(error: BaseException) -> str:
    """' at FILE line N' of the innermost frame that raised `error`, or, where `error` wraps
    another (`raise ... from err`: verifiers' TaskError around a `@vf.reward`), that of the
    original: the fault is in the wrapped code, not in the library that wrapped it."""
    while error.__cause__ is not None and error.__cause__.__traceback__ is not None:
        error = error.__cause__
    frames = traceback.extract_tb(error.__traceback__)
    return f" at {frames[-1].filename} line {frames[-1].lineno}" if frames else ""


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _as_structure(
    name: str, fn: RewardFunction, structure: dict[str, Any], n: int
) -> dict[str, torch.Tensor]:
    """A `RewardOutput`'s structure as tensors, checked: declared, [n] or pairwise [n, n]."""
    out = {}
    for key, value in structure.items():
        tensor = torch.as_tensor(value)
        if tensor.dim() == 2 and tensor.shape[1] != n:
            raise RewardFunctionError(
                f"reward function {name!r}: structure {key!r} of shape {tuple(tensor.shape)} "
                f"is neither per completion [{n}] nor pairwise [{n}, {n}]"
            )
        out[key] = tensor
    try:
        check_produced(f"reward function {name!r}", fn, out, n)
        check_declared_made(f"reward function {name!r}", fn, out)
    except ValueError as error:
        raise RewardFunctionError(str(error)) from None
    return out


def _as_reward(name: str, index: int, value: Any) -> float | None:
    """None and NaN are None (no reward: TRL's None -> NaN); a number becomes a finite
    float; a string, inf or anything else is an error."""
    if value is None:
        return None
    if isinstance(value, str | bytes):
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for sample {index}: a string, not a "
            "number or None"
        )
    try:
        reward = float(value)
    except (TypeError, ValueError) as error:
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for sample {index}: not a number or None"
        ) from error
    if math.isnan(reward):
        return None
    if not math.isfinite(reward):
        raise RewardFunctionError(
            f"reward function {name!r} returned {reward} for sample {index}: give a finite "
            "number, or None (or NaN) for no reward"
        )
    return reward


def build_reward_pipeline(
    specs: list[tuple[str, float]],
    task: Verifier | None = None,
    remote: dict[str, dict[str, Any]] | None = None,
    timeouts: dict[str, float | None] | None = None,
) -> RewardPipeline:
    """A pipeline from (name, weight) pairs: the name `task` is `task`'s verifier; any other
    name goes through `load_reward_function` (registered name or `module.path:function`); a
    registered reward marked `for_task` is a factory built with `task` (a reward of the task's
    own world, handed it explicitly: DMRL's). Functions named in `remote` run in a pool of Ray workers (`rewards.remote.RayRewardPool`)
    with those options. `timeouts`: in-process time limits per call, by name
    (`RewardPipeline`)."""
    functions = []
    for name, weight in specs:
        if name == "task":
            if task is None:
                raise ValueError("reward 'task' needs a task to verify with")
            fn = task_reward_function(task)
        else:
            fn = load_reward_function(name)
            if getattr(fn, "for_task", False):  # a reward of the task's own world (DMRL's)
                fn = fn(task)
        if remote and name in remote:
            from policyopt.rewards.remote import RayRewardPool

            inner = fn
            fn = RayRewardPool(name, fn, **remote[name])
            # The pool passes list arguments on to the workers: it takes what `fn` needs.
            needs(*needs_of(inner), optional=optional_needs_of(inner))(fn)
        functions.append((name, fn, weight))
    return RewardPipeline(functions, timeouts)
