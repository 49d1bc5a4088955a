"""Where a base trajectory forks (SPEC §4.3): at the start of its highest-entropy sentences.

Sentences are found by a rule splitter on the decoded text, mapped back to token positions: a
sentence ends at a newline, or at `.`, `!` or `?` followed by whitespace (so `3.5` and `A:23`
do not split, and the arithmetic task's `7+12=19. 19-5=14. A:23` gives three sentences); the
next sentence starts at the token holding its first non-space character. A sentence's score is
the mean rollout-time entropy of its tokens. The first sentence starts at the root, where the
base rollouts already branch, so only later sentences are fork candidates; the forks are the
starts of the K̂ best-scoring candidates (all of them if fewer).

`fork_unit="token"` is the token-entropy ablation (TreeRL's forks): every token after the first
is a candidate, scored by its own entropy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_ENDS = ".!?"


def sentence_starts(pieces: Sequence[str]) -> list[int]:
    """Token index of each sentence's first token (0 first), from each token's text."""
    starts = [0]
    pending = False  # a sentence ended; the next non-space character starts a new one
    after_end = False  # the previous character was a terminator
    for index, piece in enumerate(pieces):
        for ch in piece:
            if ch.isspace():
                pending = pending or after_end or ch == "\n"
                after_end = False
                continue
            if pending and index != starts[-1]:
                starts.append(index)
            pending = False
            after_end = ch in _ENDS
    return starts


def candidate_scores(
    pieces: Sequence[str], entropy: torch.Tensor, fork_unit: str = "sentence"
) -> list[tuple[int, float]]:
    """(fork position, score) of every fork candidate of one response.

    pieces: the text of each response token (EOS as ""); entropy [L]: its rollout-time
    entropies. Positions are token indices > 0 (a fork at t keeps tokens [0, t)).
    """
    length = len(pieces)
    if fork_unit == "token":
        return [(t, float(entropy[t])) for t in range(1, length)]
    if fork_unit != "sentence":
        raise ValueError(f"fork_unit must be 'sentence' or 'token', got {fork_unit!r}")
    starts = sentence_starts(pieces)
    bounds = [*starts, length]
    return [(s, float(entropy[s:e].mean())) for s, e in zip(bounds[1:-1], bounds[2:], strict=True)]


def choose_forks(candidates: list[tuple[int, float]], k: int) -> list[int]:
    """The positions of the k best-scoring candidates (earlier first on ties), ascending."""
    ranked = sorted(candidates, key=lambda c: (-c[1], c[0]))
    return sorted(pos for pos, _ in ranked[: max(k, 0)])
