"""Stale rollouts: the FIFO's versions by hand, and in the trainer k = 0 is the on-policy
step while k > 0 trains on the stored older rollouts with their sampling log-probs."""

import pytest

from policyopt.trainer.staleness import StaleQueue


def test_fifo_versions_by_hand():
    sampled = []

    def sample_at(step):
        def sample():
            sampled.append(step)
            return f"batch sampled at {step}"

        return sample

    queue = StaleQueue(2)
    got = [queue.exchange(step, sample_at(step)) for step in range(5)]
    # Step 0 fills the FIFO with 2 batches of the initial policy, then samples its own.
    assert sampled == [0, 0, 0, 1, 2, 3, 4]
    assert [v for _, v in got] == [0, 0, 0, 1, 2]  # staleness min(t, 2): 0, 1, 2, 2, 2
    assert got[3][0] == "batch sampled at 1" and len(queue) == 2
    fresh = StaleQueue(0)
    assert [fresh.exchange(s, sample_at(s))[1] for s in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="rollout.staleness must be >= 0"):
        StaleQueue(-1)
