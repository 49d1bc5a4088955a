"""A run whose every advantage is 0 step after step says so once (nothing is learned)."""

from policyopt.train.stall import StallWatch


def test_says_so_once_after_the_set_number_of_flat_steps():
    watch = StallWatch(steps=3)
    flat = {"advantage/abs_mean": 0.0}
    assert watch.update(flat) is None and watch.update(flat) is None
    message = watch.update(flat)
    assert message is not None and "every advantage has been 0 for 3 steps" in message
    assert watch.update(flat) is None  # once


def test_a_step_that_learns_resets_the_count():
    watch = StallWatch(steps=2)
    assert watch.update({"advantage/abs_mean": 0.0}) is None
    assert watch.update({"advantage/abs_mean": 0.3}) is None
    assert watch.update({"advantage/abs_mean": 0.0}) is None
    assert watch.update({"skipped_update": 1.0}) is not None  # no group passed: also flat
