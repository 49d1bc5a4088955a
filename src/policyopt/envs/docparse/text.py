"""DocPO's text reward (SPEC §5): one minus the normalised character edit distance.

    R = 1 − Lev(y, y*) / max(|y|, |y*|),    R = 1 when both strings are empty.

The strings are compared as given (no whitespace or case folding): what the policy must
reproduce is the reference text itself.
"""

from __future__ import annotations

from rapidfuzz.distance import Levenshtein


def text_reward(prediction: str, reference: str) -> float:
    """1 − normalised Levenshtein distance of the two strings, in [0, 1]."""
    if not isinstance(prediction, str) or not isinstance(reference, str):
        raise TypeError(
            "text_reward: prediction and reference must be str, got "
            f"{type(prediction).__name__} and {type(reference).__name__}"
        )
    return float(Levenshtein.normalized_similarity(prediction, reference))
