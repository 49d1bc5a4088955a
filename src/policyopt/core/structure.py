"""Declared structure: what one part of a step hands to a later one, under a declared name.

Some parts need more than rewards and log-probs: HISPO's loss needs segment ids, DATPO's
advantage needs block ids (and, optionally, the diversity bonus), SRPO's advantage needs the
distances between a group's rankings. The part that makes such a value declares it with
`@produces(name)`; the part that uses it declares `@needs(name)`. The trainer then passes
each needed value as the keyword argument of that name, and a value nobody produced is a
`MissingStructureError` that names the consumer, the missing name and the registered parts
that declare they produce it (never a silently dropped keyword).

Producers: rollout strategies, rollout annotators, reward functions (through
`policyopt.rewards.functions.RewardOutput`) and reward shapers (through
`ShapingContext.add_structure`). Consumers: advantage estimators, policy losses, reward
shapers. Values travel in `Rollouts.structure` with the step's N rollouts as first dimension:

- per rollout   [N]
- per token     [N, R]  (R the response width of the rollouts)
- pairwise      [N, N]  (entries between rollouts of different groups are never read;
                         `Rollouts.pairwise` names these, since R may equal N)

The decorators only set attributes, so they apply to functions, classes and factories
alike, in any order with a registry's `register` decorator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from torch import Tensor

from policyopt.core.registry import all_registries

P = TypeVar("P")

# Values the trainer supplies itself for every step: they are always present.
BUILTIN = {
    "response_mask": "the response mask [N, R] (1 = generated token)",
    "entropies": "the rollout-time token entropies [N, R] of the behaviour policy",
}


class MissingStructureError(ValueError):
    """A part needs a value that no part of this run produced."""


def needs(*names: str, optional: Iterable[str] = ()) -> Callable[[P], P]:
    """Declare the structure a consumer takes as keyword arguments.

    `names` are required (a missing one is a `MissingStructureError`); `optional` ones are
    passed only when some part produced them (e.g. DATPO's diversity bonus)."""
    required, maybe = _names(names), _names(optional)

    def mark(part: P) -> P:
        part.needs = required  # type: ignore[attr-defined]
        part.optional_needs = maybe  # type: ignore[attr-defined]
        return part

    return mark


def produces(*names: str) -> Callable[[P], P]:
    """Declare the structure a producer adds to the step's `Rollouts.structure`."""
    declared = _names(names)

    def mark(part: P) -> P:
        part.produces = declared  # type: ignore[attr-defined]
        return part

    return mark


def needs_of(part: Any) -> tuple[str, ...]:
    return tuple(getattr(part, "needs", ()))


def optional_needs_of(part: Any) -> tuple[str, ...]:
    return tuple(getattr(part, "optional_needs", ()))


def produces_of(part: Any) -> tuple[str, ...]:
    return tuple(getattr(part, "produces", ()))


def registered_producers(name: str) -> list[str]:
    """`kind 'entry'` of every registered part that declares it produces `name` (of those
    imported: an environment not yet used is not imported to answer)."""
    return [
        f"{registry.kind} {entry!r}"
        for registry in all_registries()
        for entry in registry.loaded()
        if name in produces_of(registry.get(entry))
    ]


def missing_message(consumer: str, name: str, where: str = "this run") -> str:
    """`<consumer> needs 'x', which no part of <where> produces; it is produced by ...`."""
    producers = registered_producers(name)
    hint = (
        f"it is produced by {', '.join(producers)}: configure one of them"
        if producers
        else "no registered part declares it produces it (mark the producer with "
        "@produces(...) from policyopt.core.structure)"
    )
    return f"{consumer} needs {name!r}, which no part of {where} produces; {hint}"


def gather(consumer: str, part: Any, available: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments `part` declares it needs, taken from `available`.

    consumer: how to name the part in an error (e.g. "advantage estimator 'datpo'")."""
    out = {}
    for name in needs_of(part):
        if name not in available:
            raise MissingStructureError(missing_message(consumer, name))
        out[name] = available[name]
    out.update({name: available[name] for name in optional_needs_of(part) if name in available})
    return out


def check_produced(producer: str, part: Any, new: Mapping[str, Any], n: int) -> None:
    """What a producer added must be what it declared, each with first dimension N."""
    declared = set(produces_of(part))
    undeclared = sorted(set(new) - declared)
    if undeclared:
        raise ValueError(
            f"{producer} produced {undeclared} without declaring it: mark it with "
            f"@produces({', '.join(map(repr, undeclared))}) from policyopt.core.structure"
        )
    for name, value in new.items():
        if not isinstance(value, Tensor) or value.dim() not in (1, 2) or value.shape[0] != n:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(
                f"{producer} produced {name!r} of shape {got}; structure must be a tensor "
                f"[N], [N, R] or [N, N] with N = {n} rollouts"
            )


def check_declared_made(producer: str, part: Any, available: Mapping[str, Any]) -> None:
    """Every name a producer declares must be there after it ran."""
    absent = [name for name in produces_of(part) if name not in available]
    if absent:
        raise ValueError(f"{producer} declares it produces {absent} but did not produce them")


def _names(names: Iterable[str]) -> tuple[str, ...]:
    out = tuple(names)
    for name in out:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a structure name must be a Python identifier, got {name!r}")
    return out
