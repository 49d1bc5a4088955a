"""What one call of a reward function can reach: its own copies of its inputs, and a time
limit (principle 4 of issue 41, "no part can corrupt another").

Inputs. Reward functions are called one after another on the same batch, and the batch is
then logged (`samples.jsonl`) and trained on. A function that edits its `completions` list
in place (say, to strip a prefix) would change what every later function scores and what is
logged; one that edits a row's dict column would do the same to the columns. `own_copy`
gives each call its own lists, and deep copies of mutable values inside them; strings and
numbers are immutable and shared.

Time. `call_with_time_limit(fn, timeout_s, what)` returns `fn()` or raises
`TimeLimitExceeded`. On the main thread, `fn` runs there (a reward function may rely on
being on the main thread: math-verify's own timeouts use `signal.alarm`, which works only
there) and a watchdog thread, at the limit, sends `WAKE_SIGNAL` to the main thread, whose
handler raises into the running function: a Python loop, a sleep, a lock or socket wait are
all interrupted, and the caller gets control back with nothing left running. Code that sits
in C without returning to the interpreter (a catastrophic regular expression) cannot be
interrupted; if the function has still not returned after a further grace period, the
watchdog writes why to stderr and ends the process (status `EXIT_STATUS`), since the run
would otherwise hang forever. Off the main thread no signal can reach the caller's thread, so
`fn` runs in a helper daemon thread and the caller stops waiting at the limit; that thread
cannot be killed and runs on until the process ends, which the error says.

Calls nest (a task verifier that calls a reward function): only the outermost call is
limited, and an inner one runs directly under the outer limit.
"""

from __future__ import annotations

import contextvars
import copy
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# The limit of one call of an in-process reward function, when nothing sets another (a
# pipeline's `timeouts`, or the function's own `time_limit_s` attribute). Generous: it is
# there to end a call that will never return, not to pace slow ones (a judge model scoring a
# large batch on a CPU can take minutes).
DEFAULT_TIMEOUT_S = 600.0
# This long after the limit, a call that could not be interrupted ends the process.
GRACE_S = 60.0
EXIT_STATUS = 124  # as timeout(1) gives

# The signal that wakes the main thread at a limit: not SIGALRM (math-verify's), not SIGINT
# (the user's Ctrl-C).
WAKE_SIGNAL: signal.Signals | None = getattr(signal, "SIGUSR2", None)

_ATOMS = (str, bytes, int, float, bool, complex, type(None))


class TimeLimitExceeded(Exception):
    """A call ran past its limit. `stopped`: whether it was interrupted (False: it runs on
    in a helper thread that cannot be killed)."""

    def __init__(self, timeout_s: float, stopped: bool) -> None:
        super().__init__(timeout_s, stopped)
        self.timeout_s = timeout_s
        self.stopped = stopped


def own_copy(value: Any) -> Any:
    """A copy of `value` that a call may change freely: a list is a new list, each mutable
    item deep-copied; immutable values are themselves. A value that cannot be copied (a lock,
    an open file) is shared as is."""
    if isinstance(value, list):
        return [_item(v) for v in value]
    return _item(value)


def _item(value: Any) -> Any:
    if type(value) in _ATOMS:
        return value
    if type(value) is list and all(type(v) in _ATOMS for v in value):
        return value[:]  # token ids, a list of strings: a shallow copy is a full one
    return _deep(value)


def _deep(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - not copyable: nothing else can be handed over
        return value


# Inside a limited call (the outer limit covers inner calls).
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("limited_call", default=False)


def call_with_time_limit(fn: Callable[[], T], timeout_s: float | None, what: str) -> T:
    """`fn()`, or `TimeLimitExceeded` after `timeout_s` seconds (None: no limit). `what`
    names the call in the message written if the process must be ended (module doc)."""
    if timeout_s is None or _inside.get():
        return fn()
    token = _inside.set(True)
    try:
        on_main = threading.current_thread() is threading.main_thread()
        if on_main and WAKE_SIGNAL is not None and hasattr(signal, "pthread_kill"):
            return _on_main_thread(fn, timeout_s, what)
        return _on_helper_thread(fn, timeout_s)
    finally:
        _inside.reset(token)


# ----------------------------------------------------------------- on the main thread
class _Interrupted(BaseException):
    """Raised into a call at its limit. A BaseException, so that the function's own
    `except Exception` (math-verify's, sympy's) does not swallow it and go on."""


class _Watch:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fired = False  # the limit passed and the signal was sent
        self.done = False  # the call returned (or raised): a late signal is ignored


_current: _Watch | None = None
_previous_handler: Any = None


def _on_signal(signum: int, frame: Any) -> None:
    watch = _current
    if watch is not None and watch.fired and not watch.done:
        raise _Interrupted
    if callable(_previous_handler):  # someone else's use of the signal
        _previous_handler(signum, frame)


def _install_handler() -> None:
    """Our handler stays installed once set: restoring the default disposition (which ends
    the process) could let a signal sent just before the call ended kill the process."""
    global _previous_handler
    assert WAKE_SIGNAL is not None
    installed = signal.getsignal(WAKE_SIGNAL)
    if installed is not _on_signal:
        _previous_handler = installed
        signal.signal(WAKE_SIGNAL, _on_signal)


def _on_main_thread(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    global _current
    _install_handler()
    watch, stop = _Watch(), threading.Event()
    main = threading.main_thread().ident
    watchdog = threading.Thread(
        target=_watch, args=(watch, stop, main, timeout_s, what), daemon=True
    )
    _current = watch
    try:
        try:
            watchdog.start()
            return fn()
        finally:
            _end(watch, stop)
    except _Interrupted:
        # Again: the interruption may have landed inside the first `_end` (the signal is
        # sent once, so this one completes).
        _end(watch, stop)
        raise TimeLimitExceeded(timeout_s, stopped=True) from None
    finally:
        _current = None


def _end(watch: _Watch, stop: threading.Event) -> None:
    with watch.lock:
        watch.done = True
    stop.set()


def _watch(watch: _Watch, stop: threading.Event, main: int, timeout_s: float, what: str) -> None:
    if stop.wait(timeout_s):
        return
    with watch.lock:
        if watch.done:
            return
        watch.fired = True
        signal.pthread_kill(main, WAKE_SIGNAL)
    if stop.wait(GRACE_S):
        return
    # Still running: it sits in C code that never returns to the interpreter.
    sys.stderr.write(
        f"policyopt: error: {what} did not return within its time limit of {timeout_s:g} s "
        "and cannot be interrupted (it is running C code); ending the process\n"
    )
    sys.stderr.flush()
    os._exit(EXIT_STATUS)


# ----------------------------------------------------------------- off the main thread
def _on_helper_thread(fn: Callable[[], T], timeout_s: float) -> T:
    import torch

    box: dict[str, Any] = {}
    done = threading.Event()
    grad = torch.is_grad_enabled()  # thread-local in torch: carried over

    def run() -> None:
        try:
            with torch.set_grad_enabled(grad):
                box["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = error
        finally:
            done.set()

    context = contextvars.copy_context()  # with `_inside` set: nested calls run directly
    threading.Thread(target=context.run, args=(run,), daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeLimitExceeded(timeout_s, stopped=False)
    if "error" in box:
        raise box["error"]
    return box["value"]
