"""Where a base trajectory forks (SPEC §4.3): at the start of its highest-entropy sentences.

Text, not tokens, decides where sentences are. A response's token ids are decoded into pieces
(`token_pieces`), each token's share of the decoded text: a token is decoded together with the
few tokens before it, and its piece is what it adds. That is right for any tokenizer, where
decoding tokens one by one is not: SentencePiece drops a token's leading-space marker (`▁The`
alone decodes to `The`), WordPiece joins pieces with spaces, and a byte-level BPE token may
hold half a UTF-8 character (alone it decodes to `\ufffd`).

The pieces' concatenation is split into sentences by pysbd (English rules: `Dr. Smith`, `3.5`
and `e.g.` do not end a sentence; a newline does). A sentence starts at the token holding
its first non-space character (so a leading-space token such as ` Then` starts the sentence
it opens). The arithmetic task's `7+12=19. 19-5=14. A:23` gives three sentences. A sentence's
score is the mean rollout-time entropy of its tokens. The first sentence starts at the root,
where the base rollouts already branch, so only later sentences are fork candidates; the forks
are the starts of the K̂ best-scoring candidates (all of them if fewer).

`fork_unit="token"` is the token-entropy ablation (TreeRL's forks): every token after the first
is a candidate, scored by its own entropy.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

DECODE_CONTEXT = 6  # tokens decoded before each token: enough for any multi-token character


@lru_cache(maxsize=1)
def _segmenter() -> Any:
    import pysbd

    return pysbd.Segmenter(language="en", clean=False, char_span=True)


def token_pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's share of the decoded text of `ids` (special tokens decode to "").

    Piece i = decode(ids[i−c : i+1]) minus decode(ids[i−c : i]), c = DECODE_CONTEXT; an
    incomplete character at the end of either decode (`\ufffd`) is left for the token that
    completes it."""
    ids = list(ids)
    starts = [max(0, i - DECODE_CONTEXT) for i in range(len(ids))]
    texts = tokenizer.batch_decode(
        [ids[s : i + 1] for i, s in enumerate(starts)] + [ids[s:i] for i, s in enumerate(starts)],
        skip_special_tokens=True,
    )
    pieces = []
    for with_token, before in zip(texts[: len(ids)], texts[len(ids) :], strict=True):
        with_token, before = with_token.rstrip("\ufffd"), before.rstrip("\ufffd")
        pieces.append(with_token[len(before) :] if with_token.startswith(before) else with_token)
    return pieces


def sentence_starts(pieces: Sequence[str]) -> list[int]:
    """Token index of each sentence's first token (0 first), from each token's text."""
    text = "".join(pieces)
    ends = list(itertools.accumulate(len(p) for p in pieces))  # piece i covers [ends[i-1], ends[i])
    starts = [0]  # the first sentence starts at the first token, spaces included
    for span in _segmenter().segment(text)[1:]:
        first = span.start + (len(span.sent) - len(span.sent.lstrip()))
        if first >= len(text):
            continue
        token = bisect.bisect_right(ends, first)  # the piece holding character `first`
        if token > starts[-1]:
            starts.append(token)
    return starts


def candidate_scores(
    pieces: Sequence[str], entropy: torch.Tensor, fork_unit: str = "sentence"
) -> list[tuple[int, float]]:
    """(fork position, score) of every fork candidate of one response.

    pieces: the text of each response token (`token_pieces`; EOS as ""); entropy [L]: its
    rollout-time entropies. Positions are token indices > 0 (a fork at t keeps tokens [0, t)).
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
