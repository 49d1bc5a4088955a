"""Reward functions that tests load by `module:function` (tests/conftest.py puts this folder on sys.path)."""

import torch

from policyopt.core.structure import produces
from policyopt.rewards.functions import RewardOutput


def digit_fraction(prompts, completions, **columns):
    """Fraction of digits in a completion: varies even for an untrained model, so groups
    have non-zero advantages and every step really moves the parameters."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def raises_on_odd_answer(prompts, completions, answer, **columns):
    """Fails on the samples of problems with an odd answer."""
    if any(int(a) % 2 for a in answer):
        raise ZeroDivisionError("boom")
    return [0.0] * len(completions)


def digit_fraction_heard(prompts, completions, **columns):
    """`digit_fraction`, with a `prefetch` that records the completions it is handed early."""
    return digit_fraction(prompts, completions, **columns)


digit_fraction_heard.heard = []
digit_fraction_heard.prefetch = lambda prompts, completions, **columns: (
    digit_fraction_heard.heard.extend(zip(prompts, completions, columns["answer"], strict=True))
)


@produces("digit_count", "same_length")
def digit_fraction_with_structure(prompts, completions, **columns):
    """`digit_fraction`, returning declared structure too: each completion's digit count
    (per rollout) and whether two completions have the same length (pairwise)."""
    lengths = [len(text) for text in completions]
    return RewardOutput(
        digit_fraction(prompts, completions, **columns),
        {
            "digit_count": [sum(c.isdigit() for c in text) for text in completions],
            "same_length": torch.tensor([[float(a == b) for b in lengths] for a in lengths]),
        },
    )


def always_one(prompts, completions, **columns):
    """Every completion correct: groups are constant under the verifier alone."""
    return [1.0] * len(completions)


def char_count(prompts, completions, **columns):
    """A length bonus: the completion's number of characters."""
    return [float(len(text)) for text in completions]


def dies_or_hangs(prompts, completions, **columns):
    """Length of the completion; the worker process exits on a completion containing "die"
    and sleeps for ten minutes on one containing "hang" (Ray pool failure tests)."""
    import os
    import time

    if any("die" in c for c in completions):
        os._exit(3)
    if any("hang" in c for c in completions):
        time.sleep(600)
    return [float(len(c)) for c in completions]


def digit_fraction_even_answers(prompts, completions, answer, **columns):
    """`digit_fraction` on problems with an even answer, 0 on the others: the groups of
    odd-answer problems are constant, so dynamic sampling drops them and samples again."""
    return [
        digit_fraction([p], [c])[0] if int(a) % 2 == 0 else 0.0
        for p, c, a in zip(prompts, completions, answer, strict=True)
    ]
