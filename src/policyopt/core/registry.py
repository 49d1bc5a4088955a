"""Name -> object registries filled by decorators.

Every plug point (advantage estimators, policy losses, reward functions, shapers, tasks,
presets, rollout engines) is a `Registry`. A lookup of an unknown name raises a `KeyError`
that lists the valid names and suggests the nearest one.

An entry can also be declared lazily (`Registry.lazy`): its name is known at once, and the
module that registers it (an environment behind an extra, say) is imported on first lookup.
Where that import fails for want of a third-party package, the lookup says which extra to
install instead of showing the import error.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

# Every registry ever created, so that declared structure can name the parts that produce a
# value (`policyopt.core.structure.registered_producers`) without importing the layers above.
_ALL: list[Registry] = []  # type: ignore[type-arg]


class MissingExtraError(ImportError):
    """A lazily registered entry whose module needs a package that is not installed."""


class Registry(Generic[T]):
    """A plain dict of named entries with a decorator to add to it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        # name -> (module that registers it on import, the pip extra its imports need)
        self._lazy: dict[str, tuple[str, str]] = {}
        _ALL.append(self)

    def lazy(self, name: str, module: str, extra: str) -> None:
        """Declare `name` as registered by importing `module`, whose imports need the
        `policyopt[extra]` install."""
        self._lazy[name] = (module, extra)

    def load(self, name: str) -> None:
        """Import the module that registers the lazy entry `name` (nothing if it is not lazy
        or already registered)."""
        if name in self._entries or name not in self._lazy:
            return
        module, extra = self._lazy[name]
        try:
            importlib.import_module(module)
        except ImportError as err:
            missing = err.name or str(err)
            raise MissingExtraError(
                f"{self.kind} {name!r} needs the {extra!r} extra (missing module {missing!r}): "
                f"pip install 'policyopt[{extra}]'"
            ) from None
        if name not in self._entries:
            raise KeyError(f"{self.kind} {name!r}: importing {module} did not register it")

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        self.load(name)
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(unknown_name_message(self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._lazy})

    def loaded(self) -> list[str]:
        """The names registered so far, without the lazy ones not yet imported."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def unknown_name_message(kind: str, name: str, valid: list[str]) -> str:
    """`unknown <kind> 'x'; did you mean 'y'? valid: a, b, c`."""
    close = difflib.get_close_matches(name, valid, n=3)
    # The same letters in another order (a transposition: gpro for grpo) first, then
    # difflib's order.
    close.sort(key=lambda v: sorted(v) != sorted(name))
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}{hint or ';'} valid names: {', '.join(valid)}"


def all_registries() -> list[Registry]:  # type: ignore[type-arg]
    """Every registry created so far (their entries as registered by the imported modules)."""
    return list(_ALL)
