"""Reward functions run by a pool of Ray actors: slow or unsafe ones (code execution, judges).

`RayRewardPool(name, fn)` is itself a reward function (TRL's signature), so the pipeline
treats it like any other. Each call's samples are cut into chunks of `chunk_size`; an idle
actor takes the next chunk, so `num_workers` chunks are scored at once, in other processes.

A worker is never trusted to come back: a chunk that is not scored within `timeout_s` of
being handed out (the function hangs, or loops), or whose worker process dies (the function
crashed the interpreter, ran out of memory, called `os._exit`), scores its samples None (the
pipeline counts them unparseable and scores them 0), is logged with the reason, and the
worker is killed and replaced by a fresh one; the run goes on. An exception the function
raises is a bug in the function, not in the worker: it is raised to the caller as in-process
(the pipeline then names the sample that fails).

`prefetch` (the pipeline's early start, fed by the rollout engine's `on_finished`) queues a
finished response at once, so that scoring runs while longer responses are still being
sampled; the later call collects those values instead of scoring them again (same values).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class _Failure:
    """An exception the reward function raised on a chunk, re-raised when its values are asked."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass
class _Chunk:
    worker: int
    keys: list[bytes]
    started: float


class _RewardWorker:
    """The actor: unpickles the function after putting the driver's import path in place (a
    function from a module the driver imported from its own path, e.g. the tests folder)."""

    def __init__(self, payload: bytes, sys_path: list[str]) -> None:
        from ray import cloudpickle

        sys.path[:0] = [p for p in sys_path if p not in sys.path]
        self.fn = cloudpickle.loads(payload)

    def pid(self) -> int:
        return os.getpid()

    def score(self, prompts: list[Any], completions: list[Any], columns: dict[str, list]) -> Any:
        """The function's values, called as in-process (TRL's way, by keyword: TRL's own
        functions take `completions` first). `sys.exit()` in the function is one of its
        errors, as in-process, not the end of the worker."""
        from policyopt.rewards.calling import call_reward_function

        try:
            values = call_reward_function(self.fn, prompts, completions, **columns)
        except SystemExit as error:
            raise RuntimeError(f"the reward function called sys.exit({error.code!r})") from None
        if type(values).__module__ == "numpy" and getattr(values, "ndim", None) == 0:
            raise TypeError(
                f"returned a 0-d numpy array ({values.item()!r}: one number), not a list of "
                f"{len(completions)} numbers (one per completion)"
            )
        if type(values).__module__ in ("numpy", "torch"):
            values = values.tolist()
        if not isinstance(values, list | tuple):
            raise TypeError(
                f"returned a {type(values).__name__}, not a list of {len(completions)} numbers"
            )
        return list(values)


class RayRewardPool:
    """`fn` (TRL signature) scored by `num_workers` Ray actors; see the module docstring.

    Uses the Ray cluster this process is connected to (`ray.init` done by the caller, e.g.
    `ray.init(address="auto")` on a cluster), or starts a local one with `address=None`.
    """

    # No in-process time limit on a call (`RewardPipeline`): each chunk has its own
    # (`timeout_s`), and a hung worker is killed and replaced, so a call always ends.
    time_limit_s = None

    def __init__(
        self,
        name: str,
        fn: Callable[..., Sequence[Any]],
        *,
        num_workers: int = 2,
        timeout_s: float = 60.0,
        chunk_size: int = 8,
        cpus_per_worker: float = 1.0,
    ) -> None:
        import ray
        from ray import cloudpickle

        if num_workers < 1:
            raise ValueError(f"reward {name!r}: num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"reward {name!r}: timeout_s must be > 0, got {timeout_s}")
        if chunk_size < 1:
            raise ValueError(f"reward {name!r}: chunk_size must be >= 1, got {chunk_size}")
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.name = name
        self.__name__ = name
        self.timeout_s = timeout_s
        self.chunk_size = chunk_size
        self._ray = ray
        self._actor_class = ray.remote(num_cpus=cpus_per_worker, max_restarts=0)(_RewardWorker)
        self._payload = cloudpickle.dumps(fn)
        self._workers: list[Any] = []
        self._idle: list[int] = []
        self._starting: dict[Any, int] = {}  # ready-probe ref -> worker index
        for index in range(num_workers):
            self._start_worker(index)
        self._pending: deque[tuple[bytes, str, str, dict[str, Any]]] = deque()
        self._queued: set[bytes] = set()  # keys pending or in flight
        self._in_flight: dict[Any, _Chunk] = {}
        self._results: dict[bytes, Any] = {}
        # Samples scored None because their worker died or timed out, over the pool's life.
        self.failed_samples = 0
        self.replaced_workers = 0

    # ----------------------------------------------------------------- the reward function
    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[Any]:
        # Per-sample lists travel to the workers; `trainer_state` (one object) does not.
        columns = {k: v for k, v in columns.items() if isinstance(v, list | tuple)}
        keys = self._enqueue(prompts, completions, columns)
        self._pump(wait_for=set(keys))
        values = [self._results[k] for k in keys]
        for k in set(keys):
            del self._results[k]
        for v in values:
            if isinstance(v, _Failure):
                raise v.error
        return values

    def prefetch(self, prompts: list[str], completions: list[str], **columns: Any) -> None:
        """Start scoring these samples now (a hint; the call collects the values)."""
        self._enqueue(prompts, completions, columns)
        self._pump(wait_for=None)

    def close(self) -> None:
        """Kill the workers (the pool cannot be used afterwards)."""
        for worker in self._workers:
            self._ray.kill(worker, no_restart=True)
        self._workers, self._idle, self._starting = [], [], {}

    # ----------------------------------------------------------------- scheduling
    def _start_worker(self, index: int) -> None:
        """Start worker `index`; it takes chunks once up (its start-up, which imports the
        function's modules, does not count against `timeout_s`)."""
        worker = self._actor_class.remote(self._payload, list(sys.path))
        if index < len(self._workers):
            self._workers[index] = worker
        else:
            self._workers.append(worker)
        self._starting[worker.pid.remote()] = index

    def _enqueue(
        self, prompts: list[str], completions: list[str], columns: dict[str, list]
    ) -> list[bytes]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        keys = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            row = {c: values[i] for c, values in columns.items()}
            # A sample is its prompt, completion and columns: asked twice, scored once.
            key = pickle.dumps((prompt, completion, sorted(row.items())))
            keys.append(key)
            if key not in self._results and key not in self._queued:
                self._queued.add(key)
                self._pending.append((key, prompt, completion, row))
        return keys

    def _pump(self, wait_for: set[bytes] | None) -> None:
        """Hand chunks to idle workers and collect what is done; with `wait_for`, until
        those samples all have a value (or a failure)."""
        while True:
            self._collect()
            self._expire()
            self._dispatch()
            if wait_for is None or all(k in self._results for k in wait_for):
                return
            # Wait for a chunk to finish, a worker to come up, or the first deadline.
            deadlines = [c.started + self.timeout_s for c in self._in_flight.values()]
            wait_s = max(min(deadlines) - time.monotonic(), 0.0) if deadlines else None
            self._ray.wait([*self._in_flight, *self._starting], num_returns=1, timeout=wait_s)

    def _dispatch(self) -> None:
        while self._idle and self._pending:
            worker = self._idle.pop()
            batch = [
                self._pending.popleft() for _ in range(min(self.chunk_size, len(self._pending)))
            ]
            keys = [b[0] for b in batch]
            columns = {c: [b[3][c] for b in batch] for c in batch[0][3]}
            ref = self._workers[worker].score.remote(
                [b[1] for b in batch], [b[2] for b in batch], columns
            )
            self._in_flight[ref] = _Chunk(worker, keys, time.monotonic())

    def _collect(self) -> None:
        """Take in workers that came up and chunks that are done."""
        if self._starting:
            up, _ = self._ray.wait(list(self._starting), num_returns=len(self._starting), timeout=0)
            for ref in up:
                index = self._starting.pop(ref)
                try:
                    self._ray.get(ref)
                except self._ray.exceptions.RayError as error:
                    raise RuntimeError(
                        f"reward {self.name!r}: a Ray worker could not start (is the function "
                        f"importable in the workers?): {error}"
                    ) from error
                self._idle.append(index)
        if not self._in_flight:
            return
        refs = list(self._in_flight)
        done, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in done:
            chunk = self._in_flight.pop(ref)
            try:
                values = self._ray.get(ref)
            except self._ray.exceptions.RayActorError as error:  # its process died
                self._replace(chunk, f"died ({type(error).__name__})")
                continue
            except self._ray.exceptions.RayTaskError as error:  # the function raised
                self._finish(chunk, [_Failure(error.as_instanceof_cause())] * len(chunk.keys))
                self._idle.append(chunk.worker)
                continue
            if len(values) != len(chunk.keys):
                failure = _Failure(
                    ValueError(f"returned {len(values)} values for {len(chunk.keys)} samples")
                )
                values = [failure] * len(chunk.keys)
            self._finish(chunk, values)
            self._idle.append(chunk.worker)

    def _expire(self) -> None:
        now = time.monotonic()
        for ref, chunk in list(self._in_flight.items()):
            if now - chunk.started >= self.timeout_s:
                del self._in_flight[ref]
                self._replace(chunk, f"timed out after {self.timeout_s:g} s")

    def _replace(self, chunk: _Chunk, reason: str) -> None:
        """Score the chunk's samples None, kill its worker and start a fresh one."""
        logger.warning(
            "reward %r: worker %d %s; its %d samples score 0; worker replaced",
            self.name,
            chunk.worker,
            reason,
            len(chunk.keys),
        )
        self._ray.kill(self._workers[chunk.worker], no_restart=True)
        self._start_worker(chunk.worker)
        self._finish(chunk, [None] * len(chunk.keys))
        self.failed_samples += len(chunk.keys)
        self.replaced_workers += 1

    def _finish(self, chunk: _Chunk, values: list[Any]) -> None:
        for key, value in zip(chunk.keys, values, strict=True):
            self._results[key] = value
            self._queued.discard(key)
