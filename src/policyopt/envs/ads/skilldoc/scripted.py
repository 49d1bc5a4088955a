"""The starting skill document and a scripted editor (random well-formed edits).

The scripted editor writes the demonstrations the LM editor is warm-started on (SFT): it
picks a parameter and a level at random and replaces that parameter's rule in its section,
deletes it, or inserts one. Each population has a section of its own (`POP_WORDS`) whose
rules set its per-population parameters (ad load multiplier, reminders). It knows the format, not what is good: which edits raise the
long-term value is left for RL to find.
"""

from __future__ import annotations

import numpy as np

from policyopt.envs.ads.adsim.params import NAMES
from policyopt.envs.ads.adsim.world import POP_WORDS
from policyopt.envs.ads.skilldoc.document import MAX_RULES_PER_SECTION, Edit, SkillDocument
from policyopt.envs.ads.skilldoc.rule_agent import rule_setting

SECTIONS = ("ads", "ranking", "budget", *POP_WORDS)
# parameter -> (section, phrase of its rules)
PHRASES = {
    "ad_load": ("ads", "keep ad load"),
    "frequency_cap": ("ads", "cap repeated ads"),
    "quality_weight": ("ranking", "set quality weight"),
    "exploration_rate": ("ranking", "explore new ads"),
    "reserve_price": ("ranking", "set reserve price"),
    "pacing_rate": ("budget", "pace budgets"),
    **{f"ad_load_{w}": (w, "keep ad load") for w in POP_WORDS},
    **{f"reminders_{w}": (w, "send reminders") for w in POP_WORDS},
}
assert set(PHRASES) == set(NAMES), "every whitelisted parameter needs a phrase"
LEVEL_WORDS = ("very low", "low", "medium", "high", "very high")

# A revenue-first start: many ads, ranked by bid with a high reserve, repeated often,
# budgets spent fast, reminders for casual and core users, more ads for clickers.
START_DOCUMENT = SkillDocument.from_dict(
    {
        "ads": ["keep ad load very high", "cap repeated ads very high"],
        "ranking": [
            "set quality weight very low",
            "explore new ads medium",
            "set reserve price high",
        ],
        "budget": ["pace budgets very high"],
        "casual": ["send reminders high"],
        "loyal": [],
        "clickers": ["keep ad load very high"],
        "core": ["send reminders medium"],
    }
)


def rule_text(param: str, level: str) -> str:
    return f"{PHRASES[param][1]} {level}"


def random_document(rng: np.random.Generator) -> SkillDocument:
    """A document with one rule per parameter (each present with probability 0.8) at
    random levels: the states warm-start demonstrations are written for."""
    sections: dict[str, list[str]] = {s: [] for s in SECTIONS}
    for param, (section, _) in PHRASES.items():
        if rng.uniform() < 0.8:
            sections[section].append(rule_text(param, str(rng.choice(LEVEL_WORDS))))
    return SkillDocument.from_dict(sections)


def demonstration_texts() -> list[str]:
    """Every completion the scripted editor can write (newline-terminated), any document."""
    out = []
    for param, (section, _) in PHRASES.items():
        out.append(f"delete {section} 1\n")
        for level in LEVEL_WORDS:
            out.append(f"insert {section}: {rule_text(param, level)}\n")
            for n in range(1, MAX_RULES_PER_SECTION + 1):
                out.append(f"replace {section} {n}: {rule_text(param, level)}\n")
                out.append(f"delete {section} {n}\n")
    return out


def edit_token_budget(tokenizer: object, margin: int = 8) -> int:
    """Tokens the editor needs: the longest demonstration (with EOS) plus `margin`."""
    encode = tokenizer  # a Hugging Face tokenizer: tokenizer(text)["input_ids"]
    longest = max(
        len(encode(t, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
        for t in demonstration_texts()
    )
    return longest + 1 + margin


def scripted_edit(doc: SkillDocument, rng: np.random.Generator) -> Edit:
    """One random well-formed edit of `doc`."""
    param = str(rng.choice(list(PHRASES)))
    section, _ = PHRASES[param]
    rules = doc.rules(section)
    where = [i for i, r in enumerate(rules) if (rule_setting(r, section) or ("",))[0] == param]
    level = str(rng.choice(LEVEL_WORDS))
    if where and rng.uniform() < 0.85:
        i = where[-1]
        if rng.uniform() < 0.85:
            return Edit(section, "replace", i, rule_text(param, level))
        return Edit(section, "delete", i, "")
    if len(rules) >= MAX_RULES_PER_SECTION:
        return Edit(section, "delete", 0, "")
    return Edit(section, "insert", len(rules), rule_text(param, level))
