"""A function call with a time limit, in a persistent child process that is killed on a timeout.

A reward computed in C code (numpy, lxml, rapidfuzz, sympy) cannot be interrupted by a signal
or a thread once it runs, and hostile model output can make it run for minutes. `TimedFunction`
runs `module:function(*args)` in a child Python process that it starts once and reuses;
a call that does not answer within `timeout_s` kills the child (the next call starts a new
one) and returns `TIMED_OUT`, as does a child that dies on the input (e.g. hitting the
address-space cap). Arguments and results travel as JSON lines, so both must be JSON values.

The child imports only the module's own file and what it imports, not the package's
`__init__` files (policyopt's would import torch): the packages above the module are
registered as empty namespace modules first. (The formula reward has its own worker pool,
with parallel workers and a cache: `docparse_formula`.)
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 120.0  # importing numpy/lxml on a loaded 2-core machine
MEMORY_BYTES = 4 << 30  # address-space cap of the child (Linux)

TIMED_OUT = object()  # what a call that ran out of time (or killed its child) returns

_BOOT = """
import importlib, json, os, sys, types
module_name, function_name, root, cap = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
parts = module_name.split(".")
for i in range(1, len(parts)):  # bare packages: no __init__ runs
    package = types.ModuleType(".".join(parts[:i]))
    package.__path__ = [os.path.join(root, *parts[:i])]
    sys.modules[package.__name__] = package
try:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
except (ImportError, ValueError, OSError):
    pass
out = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)  # anything the function prints goes to stderr, not into the replies
function = getattr(importlib.import_module(module_name), function_name)
out.write(json.dumps({"ready": True}) + "\\n")
out.flush()
for line in sys.stdin:
    try:
        reply = {"value": function(*json.loads(line))}
    except Exception as error:
        reply = {"error": repr(error)}
    out.write(json.dumps(reply) + "\\n")
    out.flush()
"""

_live: list[TimedFunction] = []


class TimedFunction:
    """`module:function` called in a child process with a time limit (module docstring).

    Thread-safe: calls from several threads take turns. After a fork, the child process of
    the parent is not used; a new one is started."""

    def __init__(self, module: str, function: str) -> None:
        self.module, self.function = module, function
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid: int | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()
        _live.append(self)

    def __call__(self, args: list[Any], timeout_s: float) -> Any:
        """The function's value on `args`, or `TIMED_OUT`. An exception the function raises
        is raised here as a RuntimeError with its repr."""
        with self._lock:
            self._start()
            try:
                self._proc.stdin.write(json.dumps(args) + "\n")  # type: ignore[union-attr]
                self._proc.stdin.flush()  # type: ignore[union-attr]
            except OSError:  # the child died since the last call
                self.kill()
                return TIMED_OUT
            reply = self._reply(timeout_s)
            if reply is None:
                self.kill()
                return TIMED_OUT
        if "error" in reply:
            raise RuntimeError(f"{self.module}.{self.function}: {reply['error']}")
        return reply["value"]

    def alive(self) -> bool:
        return self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None

    def kill(self) -> None:
        if self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def _start(self) -> None:
        if self.alive():
            return
        root = Path(__file__).resolve().parents[2]  # the folder holding `policyopt`
        self._replies = queue.Queue()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, self.module, self.function, str(root), str(MEMORY_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        self._pid = os.getpid()
        threading.Thread(target=self._read, args=(self._proc, self._replies), daemon=True).start()
        if self._reply(STARTUP_TIMEOUT_S) != {"ready": True}:
            self.kill()
            raise RuntimeError(
                f"the worker process for {self.module}.{self.function} did not start"
            )

    @staticmethod
    def _read(proc: subprocess.Popen, replies: queue.Queue[str | None]) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            replies.put(line)
        replies.put(None)

    def _reply(self, timeout_s: float) -> dict | None:
        """The next reply, or None on a timeout or a dead child."""
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return None if line is None else json.loads(line)


@atexit.register
def _stop_all() -> None:
    for function in _live:
        function.kill()
