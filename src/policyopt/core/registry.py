"""Name -> object registries filled by decorators.

Every plug point (advantage estimators, policy losses, reward functions, shapers, tasks,
presets, rollout engines) is a `Registry`. A lookup of an unknown name raises a `KeyError`
that lists the valid names and suggests the nearest one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

# Every registry ever created, so that declared structure can name the parts that produce a
# value (`policyopt.core.structure.registered_producers`) without importing the layers above.
_ALL: list[Registry] = []  # type: ignore[type-arg]


class Registry(Generic[T]):
    """A plain dict of named entries with a decorator to add to it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        _ALL.append(self)

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(unknown_name_message(self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def unknown_name_message(kind: str, name: str, valid: list[str]) -> str:
    """`unknown <kind> 'x'; did you mean 'y'? valid: a, b, c`."""
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}{hint or ';'} valid names: {', '.join(valid)}"


def all_registries() -> list[Registry]:  # type: ignore[type-arg]
    """Every registry created so far (their entries as registered by the imported modules)."""
    return list(_ALL)
