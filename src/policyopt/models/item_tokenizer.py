"""The "tokenizer" of a ranking policy: item ids <-> text.

A ranking policy's vocabulary is the set of items (documents) of its task, each with a
feature vector; its prompt is a query's candidate items and its response the items it
places, best first. In text, an item is `i<id>` (ids from 1; 0 is padding):
`"i12 i7 i40"`. This keeps the loop's text interfaces (reward functions on completions,
samples.jsonl) the same for language models and ranking policies.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ITEM = re.compile(r"\bi(\d+)\b")
PAD_ID = 0


class ItemTokenizer:
    """Encodes `i<id>` tokens of a text to ids and back; `num_items` bounds the ids."""

    pad_token_id = PAD_ID
    eos_token_id = None
    padding_side = "left"

    def __init__(self, num_items: int) -> None:
        self.num_items = num_items

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        ids = [int(m) for m in ITEM.findall(text)]
        bad = [i for i in ids if not 1 <= i <= self.num_items]
        if bad:
            raise ValueError(f"item ids {bad[:5]} outside 1..{self.num_items} in {text[:80]!r}")
        return {"input_ids": ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"i{int(i)}" for i in ids if int(i) != PAD_ID)

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(r) for r in rows]

    def save_pretrained(self, folder: str | Path) -> None:
        Path(folder, "item_tokenizer.json").write_text(json.dumps({"num_items": self.num_items}))

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> ItemTokenizer:
        config: dict[str, Any] = json.loads(Path(folder, "item_tokenizer.json").read_text())
        return cls(config["num_items"])
