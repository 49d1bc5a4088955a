"""The SVMlight / LETOR text format of learning-to-rank data sets (MSLR-WEB, Yahoo, ...).

One line per (query, document): `label qid:Q 1:v1 2:v2 ... # comment`. Features not listed
are 0. Lines of a query must be contiguous (as in every LETOR file). The file is UTF-8 text
(read as the JSONL files are, `tasks.hf_dataset.text_lines`): a byte that is not UTF-8, a
malformed line or a file without data lines is a ValueError naming the file and the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policyopt.tasks.hf_dataset import text_lines


@dataclass
class LetorQuery:
    qid: str
    labels: np.ndarray  # [n] float
    features: np.ndarray  # [n, F] float32


def read_letor(path: str | Path, num_features: int | None = None) -> list[LetorQuery]:
    """Queries of a LETOR file in file order; `num_features` defaults to the largest index."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LETOR file {path} does not exist")
    rows: list[tuple[str, float, dict[int, float]]] = []
    for lineno, text in text_lines(path):
        line = text.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            label = float(parts[0])
            if not parts[1].startswith("qid:"):
                raise ValueError("second field is not qid:<id>")
            qid = parts[1][4:]
            feats = {}
            for token in parts[2:]:
                index, value = token.split(":", 1)
                feats[int(index)] = float(value)
        except (ValueError, IndexError) as error:
            raise ValueError(
                f"{path}:{lineno}: not a LETOR line ({error}): {line[:60]!r}"
            ) from None
        rows.append((qid, label, feats))
    if not rows:
        raise ValueError(f"{path}: no data lines")
    width = num_features or max(max(f, default=0) for _, _, f in rows)
    queries: list[LetorQuery] = []
    seen: set[str] = set()
    start = 0
    for i in range(1, len(rows) + 1):
        if i < len(rows) and rows[i][0] == rows[start][0]:
            continue
        qid = rows[start][0]
        if qid in seen:
            raise ValueError(f"{path}: lines of query {qid} are not contiguous")
        seen.add(qid)
        block = rows[start:i]
        x = np.zeros((len(block), width), dtype=np.float32)
        for r, (_, _, feats) in enumerate(block):
            for index, value in feats.items():
                if not 1 <= index <= width:
                    raise ValueError(
                        f"{path}: query {qid}: feature index {index} outside 1..{width}"
                    )
                x[r, index - 1] = value
        queries.append(LetorQuery(qid, np.array([b[1] for b in block], dtype=np.float64), x))
        start = i
    return queries
