"""Code a config names is run only when the user asked for it (principle 1 of
docs/guides/reliability.md).

A config can name code to run: a reward function `module:function`, a file task's
`reward_function`, a `verifiers` taskset id (a module name), or `model.trust_remote_code:
true` (the modelling code a model folder ships). The user's own config files and overrides
are their choice. A config from elsewhere is not. That is a run folder someone else trained,
whose saved config this user's policyopt did not sign. `policyopt eval` runs the rest of
its command inside `foreign_config(...)`, and there the code such a config names is refused
unless the user named it in an override. `--allow-run-code` skips `foreign_config`.

One decision, `refusal`, is applied in two places:

- At the import point. `import_user_code(module, what)` imports a module a config names.
  `allow_user_code(what, name=..., key=...)` guards code that a library imports for us:
  verifiers' `taskset_class`, and transformers under `trust_remote_code`. This is the
  enforcement. It does not depend on which config key named the code, so a new option
  that imports code is covered without being listed anywhere.
  `tests/cli/test_principles.py: test_every_import_by_a_computed_name_goes_through_the_gate`
  reads the package's syntax tree. It fails on any import by a computed name outside a
  function that passes the gate, so the new option cannot bypass the gate unnoticed.
  A declared list of config paths would instead miss any option its author forgot to add.
- Before any work, over the merged config (its `base:` chain included): `config_code` finds
  the values the import points would import. Those are every `module:function` string,
  the keys in `CODE_OPTIONS` (options whose value is a bare module name), and
  `model.trust_remote_code`. So `eval` refuses at once, naming the config key, instead of
  after it has loaded data.

Nothing here imports torch: `policyopt.core` loads its tensor modules lazily.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

# A string naming code to import: "module.path:function" (what reward functions accept).
CODE_SPEC = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):[A-Za-z_]\w*$")

# Config keys whose value is a bare module (or package) name that is imported. Strings of the
# form `module:function` are code wherever they stand, so they are not listed.
CODE_OPTIONS = {
    "task.options.taskset": "verifiers taskset",
    "rollout.strategy_options.environment_options.taskset": "verifiers taskset",
}
TRUST_REMOTE_CODE = "model.trust_remote_code"


class UserCodeRefused(ValueError):
    """A config from elsewhere names code that the user did not accept."""


@dataclass(frozen=True)
class Foreign:
    """A config from elsewhere in force: where it came from, what to do about a refusal,
    and the config keys and string values the user gave in their own overrides."""

    source: str
    advice: str
    keys: tuple[str, ...]
    names: frozenset[str]

    def set_by_user(self, key: str) -> bool:
        return any(key == k or key.startswith(f"{k}.") for k in self.keys)

    def named_by_user(self, name: str) -> bool:
        return name in self.names or any(n.startswith(f"{name}:") for n in self.names)


_in_force: Foreign | None = None


@contextmanager
def foreign_config(source: str, advice: str, given: Mapping[str, Any]) -> Iterator[None]:
    """Within: the config `source` came from elsewhere. Code it names is refused unless the
    user named it. `given` holds the user's overrides (dotted key -> value) and `advice` tells
    them how to accept the code."""
    global _in_force
    outer = _in_force
    _in_force = Foreign(source, advice, tuple(given), frozenset(_strings(list(given.values()))))
    try:
        yield
    finally:
        _in_force = outer


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def is_own(module: str) -> bool:
    """Whether `module` is policyopt's own code, which is always allowed."""
    return module == "policyopt" or module.startswith("policyopt.")


def refusal(what: str, name: str | None = None, key: str | None = None) -> str | None:
    """Why `what` must not run, or None when it may. `name` is the module or id as the
    config gives it, and `key` the config key that asks for the code (when known)."""
    foreign = _in_force
    if foreign is None or (name is not None and is_own(name)):
        return None
    if key is not None and foreign.set_by_user(key):
        return None  # the user's own value replaced the foreign one
    if name is not None and foreign.named_by_user(name):
        return None
    return (
        f"the run's config {foreign.source} would run {what}, and this user's policyopt did "
        f"not write it (a run folder may come from someone else), so it is not obeyed: "
        f"{foreign.advice}"
    )


def allow_user_code(what: str, name: str | None = None, key: str | None = None) -> None:
    """Raise `UserCodeRefused` if `what` must not run (see `refusal`)."""
    reason = refusal(what, name, key)
    if reason is not None:
        raise UserCodeRefused(reason)


def import_user_code(module: str, what: str) -> ModuleType:
    """Import `module`, which a config names, unless that is refused."""
    allow_user_code(what, name=module)
    return importlib.import_module(module)


def config_code(raw: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str | None, str]]:
    """(dotted key, module or id, what it runs) for every value in `raw` that names code to
    run. Those are: any string of the form `module:function` outside policyopt's own modules
    (reward functions, a task's reward_function, ...), the keys in `CODE_OPTIONS`, and
    `model.trust_remote_code: true`."""
    found: list[tuple[str, str | None, str]] = []
    items = raw.items() if isinstance(raw, Mapping) else enumerate(raw)
    for k, value in items:
        key = f"{prefix}{k}"
        if isinstance(value, Mapping | list):
            found += config_code(value, f"{key}.")  # type: ignore[arg-type]
        elif isinstance(value, str) and key in CODE_OPTIONS and not is_own(value):
            found.append((key, value, f"{CODE_OPTIONS[key]} {value!r} ({key}={value})"))
        elif isinstance(value, str) and CODE_SPEC.match(value):
            module = value.split(":", 1)[0]
            if not is_own(module):
                found.append((key, module, f"module {module!r} ({key}={value})"))
        elif key == TRUST_REMOTE_CODE and value is True:
            found.append((key, None, f"the model's own code ({TRUST_REMOTE_CODE}=true)"))
    return found
