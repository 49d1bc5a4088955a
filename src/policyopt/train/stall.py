"""Noticing a run that cannot learn: every advantage 0, step after step.

A group whose rewards are all equal gets advantage 0 (GRPO's estimators), so a reward that
is constant within every group (an exact-match check the model never passes, say) trains
nothing, and the loss curve alone does not show it. `StallWatch` counts the consecutive
steps whose advantages are all 0 (or that trained on nothing) and returns one message the
first time the count reaches its limit.
"""

from __future__ import annotations

# Steps in a row with every advantage 0 before the run says so.
STALL_STEPS = 10


class StallWatch:
    """Feed it each step's metrics; it returns a message once, when `steps` steps in a row
    had every advantage 0."""

    def __init__(self, steps: int = STALL_STEPS) -> None:
        self.steps = steps
        self.flat = 0
        self.said = False

    def update(self, metrics: dict[str, float]) -> str | None:
        flat = metrics.get("skipped_update", 0.0) > 0 or metrics.get("advantage/abs_mean") == 0.0
        self.flat = self.flat + 1 if flat else 0
        if self.said or self.flat < self.steps:
            return None
        self.said = True
        return (
            f"every advantage has been 0 for {self.steps} steps: the reward is the same for "
            "every sample of every group, so nothing is learned; check the reward on the "
            "samples (samples.jsonl), e.g. a check the model never passes"
        )
