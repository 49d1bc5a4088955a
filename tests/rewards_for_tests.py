"""Reward functions that tests load by `module:function` (tests/conftest.py puts this folder on sys.path)."""


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
