"""DocPO's document-parsing rewards (SPEC §5), and their adapter to TRL's reward signature.

Each reward is `(prediction: str, reference: str) -> float` in [0, 1] and never raises on
string inputs (a non-str argument is a caller bug and raises TypeError):

- `text_reward`: 1 − normalised character edit distance (docparse_text);
- `table_reward`: weighted TEDS over the HTML tables; unit costs give PubTabNet's TEDS
  (docparse_table; the exact tree edit distance is in docparse_ted);
- `formula_reward`: parse check × (0.8 symbolic equivalence + 0.2 edit similarity)
  (docparse_formula; `formula_rewards` scores a batch).

`docparse_reward_function(kind)` turns them into one TRL-style reward function
`f(prompts, completions, **columns) -> list[float]`; the registered names are `docparse`
(element type per row), `docparse_text`, `docparse_table` and `docparse_formula`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from policyopt.envs.docparse.formula import (
    DEFAULT_TIMEOUT_S,
    Judge,
    formula_reward,
    formula_rewards,
    prefetch_formula_rewards,
)
from policyopt.envs.docparse.table import DEFAULT_TIMEOUT_S as TABLE_TIMEOUT_S
from policyopt.envs.docparse.table import table_reward, teds
from policyopt.envs.docparse.text import text_reward
from policyopt.rewards.functions import REWARD_FUNCTIONS, RewardFunction

__all__ = [
    "ELEMENT_TYPES",
    "docparse_reward",
    "docparse_reward_function",
    "formula_reward",
    "formula_rewards",
    "table_reward",
    "teds",
    "text_reward",
]

ELEMENT_TYPES = ("text", "table", "formula")


def docparse_reward_function(
    kind: str = "auto",
    reference_column: str = "reference",
    type_column: str = "element_type",
    structure_cost: float = 2.0,
    content_cost: float = 1.0,
    judge: Judge | None = None,
    formula_timeout_s: float | None = DEFAULT_TIMEOUT_S,
    table_timeout_s: float | None = TABLE_TIMEOUT_S,
) -> RewardFunction:
    """A reward function with TRL's signature scoring each completion against the
    `reference_column` value of its row, with the reward of `kind` ("text", "table",
    "formula"), or with "auto" the reward named by the row's `type_column` value.
    Conversational completions (a list of messages) are scored on the last message's content.
    A formula check or a table that takes longer than its time limit scores 0 (`None`: no
    limit, trusted inputs only).
    """
    if kind not in (*ELEMENT_TYPES, "auto"):
        raise ValueError(
            f"docparse reward kind {kind!r}: expected one of {ELEMENT_TYPES} or 'auto'"
        )
    scorers: dict[str, Callable[[str, str], float]] = {
        "text": text_reward,
        "table": functools.partial(
            table_reward,
            structure_cost=structure_cost,
            content_cost=content_cost,
            timeout_s=table_timeout_s,
        ),
    }

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        n = len(completions)
        references = _column(columns, reference_column, n)
        types = _column(columns, type_column, n) if kind == "auto" else [kind] * n
        texts = []
        for i, (completion, reference, element_type) in enumerate(
            zip(completions, references, types, strict=True)
        ):
            if element_type not in ELEMENT_TYPES:
                raise ValueError(
                    f"row {i}: {type_column} {element_type!r} is not one of {ELEMENT_TYPES}"
                )
            if not isinstance(reference, str):
                raise TypeError(f"row {i}: {reference_column} must be a str, got {reference!r}")
            texts.append(_completion_text(completion, i))
        scores = [0.0] * n
        formulas = [i for i in range(n) if types[i] == "formula"]
        # All formulas in one call, whose checks run in worker processes (in parallel) while
        # this thread scores the text and tables.
        with ThreadPoolExecutor(max_workers=1) as background:
            formula_scores = background.submit(
                formula_rewards,
                [texts[i] for i in formulas],
                [references[i] for i in formulas],
                judge=judge,
                timeout_s=formula_timeout_s,
            )
            for i in range(n):
                if types[i] != "formula":
                    scores[i] = scorers[types[i]](texts[i], references[i])
            for i, value in zip(formulas, formula_scores.result(), strict=True):
                scores[i] = value
        return scores

    def prefetch(prompts: list[Any], completions: list[Any], **columns: Any) -> None:
        """Start the formula checks of these rows in the background (`RewardPipeline.prefetch`):
        the later call finds them done. Text and tables are fast enough to score at the end."""
        n = len(completions)
        references = _column(columns, reference_column, n)
        types = _column(columns, type_column, n) if kind == "auto" else [kind] * n
        rows = [i for i in range(n) if types[i] == "formula"]
        if rows:
            prefetch_formula_rewards(
                [_completion_text(completions[i], i) for i in rows],
                [references[i] for i in rows],
                judge=judge,
                timeout_s=formula_timeout_s,
            )

    reward.__name__ = "docparse" if kind == "auto" else f"docparse_{kind}"
    if kind in ("auto", "formula"):
        reward.prefetch = prefetch  # type: ignore[attr-defined]
    return reward


def _column(columns: dict[str, Any], name: str, n: int) -> list[Any]:
    if name not in columns:
        raise KeyError(f"docparse reward needs a {name!r} column; the batch has {sorted(columns)}")
    values = list(columns[name])
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
    return values


def _completion_text(completion: Any, row: int) -> str:
    """A completion as text: a str, or the content of the last message of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
    raise TypeError(
        f"row {row}: completion must be a str or a list of messages with str content, "
        f"got {type(completion).__name__}"
    )


docparse_reward = REWARD_FUNCTIONS.register("docparse")(docparse_reward_function("auto"))
for _kind in ELEMENT_TYPES:
    REWARD_FUNCTIONS.register(f"docparse_{_kind}")(docparse_reward_function(_kind))
