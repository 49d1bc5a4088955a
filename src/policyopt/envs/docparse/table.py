"""DocPO's table reward: weighted TEDS between HTML tables (SPEC §5).

    R = 1 − TED_w(T_pred, T_ref) / max(|T_pred|, |T_ref|),    |T| = node count, clipped to [0, 1]

over the trees of the first `<table>` in each string. Nodes are the table's elements; a cell
(`td`, `th`) is a leaf labelled by its tag, colspan and rowspan, holding its content as tokens
(characters of its text, `<b>`/`</b>` for inline tags, as in PubTabNet's TEDS). Costs:

- insert / delete any node: `structure_cost`;
- rename to a different label (tag, colspan or rowspan differ): `structure_cost`;
- rename a cell to a cell with the same label: `content_cost` × normalised Levenshtein distance
  of the two token sequences (0 when both are empty).

With `structure_cost = content_cost = 1` this is PubTabNet's TEDS (Zhong et al., 2020) and gives
the same values as its reference implementation (the `table-recognition-metric` package) on
tables whose cells are `td`, with three documented differences that only matter outside that:
`th` cells have their content compared (the reference skips `th` text), the table may sit
anywhere in the string (the reference needs `<html><body><table>`), and a score the reference
would make negative (trees so different that TED > max size) is clipped to 0. The weighted
variant keeps the published normaliser (node count), so with costs >= 1 weighting only adds
penalty: with the defaults (2, 1) R_w ≤ TEDS, structural errors costing twice what they cost
in TEDS and content errors the same.

Memory: the exact distance holds a few float arrays of |T_pred| × |T_ref| cells. Beyond
`MAX_NODE_PAIRS` (2,000 × 2,000 nodes, e.g. two 40 × 50 tables) the reward
falls back, with a warning, to 1 − normalised Levenshtein distance between the two trees'
postorder sequences (each cell's tokens followed by its label, other nodes' labels).

A string without a parseable `<table>` scores 0 (also when both strings lack one: an output
that is not a table cannot be rewarded as one). Nothing here raises on any string.

Time limit: hostile output can make the exact distance, a cell comparison or the parse take
seconds to minutes (two 40 × 48 tables: ~6 s here; two 200,000-character cells: ~4 s), in C
code that nothing interrupts. So with `timeout_s` set (the default, `DEFAULT_TIMEOUT_S`), a
pair longer than `IN_PROCESS_CHARS` characters together is scored in a worker process
(`policyopt.rewards.workers.TimedFunction`) that is killed when the limit passes, and the
reward is then 0, with a warning logged. Pairs up to that size score here: they take milliseconds (two
~2,000-character tables of 250 cells: ~0.1 s on a loaded 2-core machine), so the tables of
a training step pay no inter-process cost. `timeout_s=None` scores everything here, without
a limit (trusted inputs only).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from lxml import etree
from rapidfuzz.distance import Levenshtein
from rapidfuzz.process import cdist

from policyopt.envs.docparse.ted import tree_edit_distance
from policyopt.rewards.workers import TIMED_OUT, TimedFunction

CELL_TAGS = ("td", "th")
MAX_NODE_PAIRS = 4_000_000  # |T_pred| · |T_ref| above which the sequence fallback is used
DEFAULT_TIMEOUT_S = 5.0  # per pair, as the formula reward's per stage
IN_PROCESS_CHARS = 2048  # |prediction| + |reference| up to which a pair is scored here

logger = logging.getLogger(__name__)

_local = threading.local()  # lxml parsers must not be shared between threads


@dataclass(frozen=True)
class HtmlTableTree:
    """A table's tree in postorder: parent index per node (root last, -1), a hashable label
    per node, and the content tokens of each cell node (None for the other nodes)."""

    parent: tuple[int, ...]
    label: tuple[tuple, ...]
    content: tuple[tuple[str, ...] | None, ...]

    def __len__(self) -> int:
        return len(self.parent)


def table_reward(
    prediction: str,
    reference: str,
    structure_cost: float = 2.0,
    content_cost: float = 1.0,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> float:
    """DocPO table reward in [0, 1]; see the module docstring. Unit costs give TEDS.
    A pair that takes longer than `timeout_s` scores 0 (module docstring: time limit)."""
    _check_costs(structure_cost, content_cost)
    _check_str(prediction, "prediction")
    _check_str(reference, "reference")
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"table_reward: timeout_s must be > 0 or None, got {timeout_s}")
    if timeout_s is None or len(prediction) + len(reference) <= IN_PROCESS_CHARS:
        return _table_reward(prediction, reference, structure_cost, content_cost)
    value = _worker([prediction, reference, structure_cost, content_cost], timeout_s)
    if value is TIMED_OUT:
        logger.warning(
            "table_reward: no result within %.3g s (prediction of %d characters, reference "
            "of %d); scored 0",
            timeout_s,
            len(prediction),
            len(reference),
        )
        return 0.0
    return float(value)


_worker = TimedFunction(__name__, "_table_reward")


def _table_reward(
    prediction: str, reference: str, structure_cost: float, content_cost: float
) -> float:
    """The reward, computed here without a time limit."""
    pred = parse_html_table(prediction)
    ref = parse_html_table(reference)
    if pred is None or ref is None:
        return 0.0
    if pred == ref:
        return 1.0
    if len(pred) * len(ref) > MAX_NODE_PAIRS:
        logger.warning(
            "table_reward: %d x %d nodes exceed MAX_NODE_PAIRS; using the sequence fallback",
            len(pred),
            len(ref),
        )
        return float(Levenshtein.normalized_similarity(_sequence(pred), _sequence(ref)))
    distance = table_edit_distance(pred, ref, structure_cost, content_cost)
    return min(1.0, max(0.0, 1.0 - distance / max(len(pred), len(ref))))


def teds(prediction: str, reference: str, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> float:
    """PubTabNet TEDS: `table_reward` with unit costs."""
    return table_reward(
        prediction, reference, structure_cost=1.0, content_cost=1.0, timeout_s=timeout_s
    )


def table_edit_distance(
    pred: HtmlTableTree, ref: HtmlTableTree, structure_cost: float, content_cost: float
) -> float:
    """TED_w between two parsed tables with the costs of the module docstring."""
    labels: dict[tuple, int] = {}
    lab1 = np.array([labels.setdefault(lab, len(labels)) for lab in pred.label])
    lab2 = np.array([labels.setdefault(lab, len(labels)) for lab in ref.label])
    differ = lab1[:, None] != lab2[None, :]
    rename = np.where(differ, structure_cost, 0.0)
    cells1 = [i for i, c in enumerate(pred.content) if c is not None]
    cells2 = [j for j, c in enumerate(ref.content) if c is not None]
    if cells1 and cells2:
        dist = cdist(
            [pred.content[i] for i in cells1],
            [ref.content[j] for j in cells2],
            scorer=Levenshtein.normalized_distance,  # d / max(len): 0 when both are empty
            dtype=np.float64,
        )
        block = np.ix_(cells1, cells2)
        rename[block] = np.where(differ[block], structure_cost, content_cost * dist)
    return tree_edit_distance(
        pred.parent,
        ref.parent,
        np.full(len(pred), float(structure_cost)),
        np.full(len(ref), float(structure_cost)),
        rename,
    )


@lru_cache(maxsize=1024)  # references repeat across a group's rollouts
def parse_html_table(markup: str) -> HtmlTableTree | None:
    """The tree of the first `<table>` in `markup`, or None if there is none or it does not
    parse. lxml recovers from unclosed tags, so a truncated table still gets partial credit."""
    if not isinstance(markup, str) or "<table" not in markup.lower():
        return None
    parser = getattr(_local, "parser", None)
    if parser is None:
        # lxml.etree's parser, not lxml.html's: the same libxml2 tree without a Python
        # class lookup per element (twice as fast).
        parser = _local.parser = etree.HTMLParser(remove_comments=True, remove_pis=True)
    try:
        root = etree.fromstring(markup, parser)
    except (etree.LxmlError, ValueError):  # e.g. an XML encoding declaration in a str
        return None
    table = None if root is None else next(root.iter("table"), None)
    return None if table is None else _tree(table)


def _tree(table: etree._Element) -> HtmlTableTree:
    """Postorder walk with an explicit stack (deep nesting must not hit the recursion limit)."""
    parent: list[int] = []
    label: list[tuple] = []
    content: list[tuple[str, ...] | None] = []
    stack = [(table, _children(table), [])]
    while stack:
        element, pending, child_ids = stack[-1]
        if pending:
            kid = pending.pop()
            stack.append((kid, _children(kid), []))
            continue
        stack.pop()
        index = len(parent)
        parent.append(-1)
        for c in child_ids:
            parent[c] = index
        if stack:
            stack[-1][2].append(index)
        if element.tag in CELL_TAGS:
            span = (_span(element, "colspan"), _span(element, "rowspan"))
            label.append((element.tag, *span))
            content.append(_cell_tokens(element))
        else:
            label.append((element.tag,))
            content.append(None)
    return HtmlTableTree(tuple(parent), tuple(label), tuple(content))


def _children(element: etree._Element) -> list[etree._Element]:
    """Element children, reversed (popped from the end = visited left to right); cells are
    leaves."""
    if element.tag in CELL_TAGS:
        return []
    return [c for c in reversed(element) if isinstance(c.tag, str)]


def _span(cell: etree._Element, name: str) -> int | str:
    """colspan/rowspan as an int (default 1); a malformed value is kept verbatim as the label."""
    value = cell.get(name, "1")
    try:
        return int(value)
    except ValueError:
        return value


def _cell_tokens(cell: etree._Element) -> tuple[str, ...]:
    """PubTabNet's cell tokenisation: the characters of the cell's text, and for each inline
    element inside it `<tag>`, its text, its children, `</tag>`, then its tail."""
    if len(cell) == 0:
        return tuple(cell.text or "")
    tokens: list[str] = list(cell.text or "")
    for event, element in etree.iterwalk(cell, events=("start", "end")):
        if element is cell or not isinstance(element.tag, str):
            continue
        if event == "start":
            tokens.append(f"<{element.tag}>")
            tokens.extend(element.text or "")
        else:
            if element.tag != "unk":
                tokens.append(f"</{element.tag}>")
            if element.tag != "td":
                tokens.extend(element.tail or "")
    return tuple(tokens)


def _sequence(tree: HtmlTableTree) -> list:
    """Postorder sequence of the tree: a cell's tokens then its label; other nodes' labels."""
    out: list = []
    for label, content in zip(tree.label, tree.content, strict=True):
        out.extend(content or ())
        out.append(label)
    return out


def _check_costs(structure_cost: float, content_cost: float) -> None:
    if not (math.isfinite(structure_cost) and structure_cost > 0):
        raise ValueError(
            f"table_reward: structure_cost must be finite and > 0, got {structure_cost}"
        )
    if not (math.isfinite(content_cost) and content_cost >= 0):
        raise ValueError(f"table_reward: content_cost must be finite and >= 0, got {content_cost}")


def _check_str(value: object, name: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"table_reward: {name} must be a str, got {type(value).__name__}")
