"""Stale rollouts (`rollout.staleness: k`): train on batches the policy sampled k steps ago.

Asynchronous trainers (prime-rl, AReaL) generate with a policy one or more versions behind
the one they update. Here that lag is simulated exactly in one process: every step samples
a batch with the current policy and appends it to a FIFO; the step trains on the oldest
batch in the FIFO, which the policy of k steps earlier sampled. The FIFO starts with k
batches from the initial policy (so step t trains on rollouts of staleness min(t, k), as an
asynchronous trainer's first steps use the initial policy's rollouts). The loss's "old"
log-probs are then the stored sampling log-probs (the behaviour policy's), not a
recomputation with the current weights. k = 0 is the on-policy step, unchanged.

A version is one step (one rollout batch), whatever the number of optimizer updates in it
(`algorithm.minibatches` x `algorithm.ppo_epochs`).

Resume: the FIFO is not checkpointed (it holds rollouts, not tensors of the model). A
resumed run refills it with k batches from the resumed policy, so the k steps after a resume
train on staler-than-0 but fresher-than-k rollouts, as at the start of a run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class StaleQueue(Generic[T]):
    """FIFO of sampled batches with their policy version (the step that sampled them)."""

    def __init__(self, staleness: int) -> None:
        if staleness < 0:
            raise ValueError(f"rollout.staleness must be >= 0, got {staleness}")
        self.staleness = staleness
        self._queue: deque[tuple[int, T]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def exchange(self, step: int, sample: Callable[[], T]) -> tuple[T, int]:
        """Sample this step's batch (and, when the FIFO is short, the batches that fill it
        first, all with the current policy); return the oldest batch and its version."""
        while len(self._queue) < self.staleness:
            self._queue.append((step, sample()))
        self._queue.append((step, sample()))
        version, batch = self._queue.popleft()
        return batch, version
