"""Code run out of process: a time limit per reply, an address-space cap, replacement.

A reward computed in C code (numpy, lxml, rapidfuzz, sympy) cannot be interrupted by a signal
or a thread once it runs, and hostile model output can make it run for minutes or allocate
without bound. A `Worker` runs `module:function` in a child Python process that it starts
once and reuses: a request (JSON arguments) gets one reply, or one reply per value if the
function is a generator (a check in stages, each with its own limit). A reply that does not
come within its time limit, or a child that dies on the input (e.g. at the address-space
cap), gives `TIMED_OUT` and kills the child; the next request starts a new one. After a fork
the parent's child is not used. Every live worker is killed at exit.

The child imports only the module's own file and what it imports, not the packages'
`__init__` files (policyopt's would import torch): every policyopt package is registered as
an empty namespace module first.

Users: `TimedFunction` (one call at a time, the table reward), and the formula reward's pool
of parallel workers (`policyopt.envs.docparse.formula`).
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

STARTUP_TIMEOUT_S = 120.0  # importing numpy/lxml/sympy on a loaded 2-core machine
MEMORY_BYTES = 4 << 30  # default address-space cap of the child (Linux)

TIMED_OUT = object()  # what a reply that ran out of time (or killed its child) is

_BOOT = """
import importlib, inspect, json, os, sys, types
module_name, function_name, root, cap, warm_up = sys.argv[1:6]
base = os.path.join(root, "policyopt")
for folder, _, files in os.walk(base):  # bare packages: no __init__ runs
    if "__init__.py" in files:
        name = ".".join(os.path.relpath(folder, root).split(os.sep))
        package = types.ModuleType(name)
        package.__path__ = [folder]
        sys.modules[name] = package
try:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = int(cap)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
except (ImportError, ValueError, OSError):
    pass
out = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)  # anything the function prints goes to stderr, not into the replies
sys.stdout = sys.stderr
module = importlib.import_module(module_name)
function = getattr(module, function_name)
if warm_up:
    getattr(module, warm_up)()
out.write(json.dumps({"value": "ready"}) + "\\n")
out.flush()
for line in sys.stdin:
    try:
        value = function(*json.loads(line))
        for v in value if inspect.isgenerator(value) else [value]:
            out.write(json.dumps({"value": v}) + "\\n")
            out.flush()  # each stage's reply as soon as it is known
    except Exception as error:
        out.write(json.dumps({"error": repr(error)}) + "\\n")
        out.flush()
"""

_live: list[Worker] = []


class WorkerError(RuntimeError):
    """The function raised in the child (its repr), or the child did not start."""


class Worker:
    """`module:function` in a child process (module docstring). Not thread-safe: one driver
    at a time (`TimedFunction` adds a lock)."""

    def __init__(
        self,
        module: str,
        function: str,
        *,
        memory_bytes: int = MEMORY_BYTES,
        warm_up: str | None = None,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.module, self.function = module, function
        self.memory_bytes, self.warm_up = memory_bytes, warm_up
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen | None = None
        self._pid: int | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()
        _live.append(self)

    def request(self, args: list[Any]) -> bool:
        """Send one request (starting the child if needed); False if the child is gone."""
        self.start()
        try:
            self._proc.stdin.write(json.dumps(args) + "\n")  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
        except OSError:  # the child died since the last request
            self.kill()
            return False
        return True

    def reply(self, timeout_s: float) -> Any:
        """The next reply's value, or `TIMED_OUT` (the child is then killed). An exception
        the function raised is a `WorkerError`."""
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            line = None
        if line is None:
            self.kill()
            return TIMED_OUT
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(f"{self.module}.{self.function}: {reply['error']}")
        return reply["value"]

    def call(self, args: list[Any], timeout_s: float) -> Any:
        """One request, its (single) reply."""
        return self.reply(timeout_s) if self.request(args) else TIMED_OUT

    def alive(self) -> bool:
        return self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None

    def kill(self) -> None:
        if self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def start(self) -> None:
        if self.alive():
            return
        root = Path(__file__).resolve().parents[2]  # the folder holding `policyopt`
        self._replies = queue.Queue()
        argv = [self.module, self.function, str(root), str(self.memory_bytes), self.warm_up or ""]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        self._pid = os.getpid()
        threading.Thread(target=_read, args=(self._proc, self._replies), daemon=True).start()
        try:
            ready = self.reply(self.startup_timeout_s)
        except WorkerError:
            ready = TIMED_OUT
        if ready != "ready":
            raise WorkerError(f"the worker process for {self.module}.{self.function} did not start")


def _read(proc: subprocess.Popen, replies: queue.Queue[str | None]) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        replies.put(line)
    replies.put(None)


class TimedFunction:
    """`module:function(*args)` with a time limit, in one reused child (a `Worker`).

    Thread-safe: calls from several threads take turns."""

    def __init__(self, module: str, function: str, memory_bytes: int = MEMORY_BYTES) -> None:
        self.module, self.function = module, function
        self._worker = Worker(module, function, memory_bytes=memory_bytes)
        self._lock = threading.Lock()

    def __call__(self, args: list[Any], timeout_s: float) -> Any:
        """The function's value on `args`, or `TIMED_OUT`. An exception the function raises
        is raised here as a `WorkerError` (a RuntimeError) with its repr."""
        with self._lock:
            return self._worker.call(args, timeout_s)

    def alive(self) -> bool:
        return self._worker.alive()

    def kill(self) -> None:
        self._worker.kill()


@atexit.register
def _stop_all() -> None:
    for worker in _live:
        worker.kill()
