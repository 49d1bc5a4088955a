"""Ctrl-C during training: the first request ends the step under way (so the state saved is
whole), a second stops at once."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C ended the run; the message says at which step and where it resumes."""


@contextmanager
def interrupt_requests() -> Iterator[Callable[[], bool]]:
    """A function telling whether SIGINT arrived since entry. The first Ctrl-C only sets it
    (the step under way finishes, so the state saved is whole); the second restores Python's
    handler and stops at once. Outside the main thread (no handler can be set) Ctrl-C
    behaves as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    seen = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def first(signum: int, frame: Any) -> None:
        seen.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print(
            "interrupt: finishing this step and saving it (Ctrl-C again to stop at once)",
            file=sys.stderr,
        )

    signal.signal(signal.SIGINT, first)
    try:
        yield seen.is_set
    finally:
        signal.signal(signal.SIGINT, previous)
