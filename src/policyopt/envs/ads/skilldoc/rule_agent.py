"""The frozen lower-level agent, rule interpreter: skill document -> ad parameters in range.

Each rule names a parameter by a phrase and a level:

    ad_load           "ad load"           levels: very low 0.05, low 0.25, medium 0.5,
    quality_weight    "quality"                   high 0.75, very high 0.95
    pacing_rate       "pac" (pace, pacing)        (fractions of the parameter's range)
    exploration_rate  "explor"
    frequency_cap     "repeat", "frequency"
    reserve_price     "reserve"

In a section named after a population (`POP_WORDS`: casual, loyal, clickers, core) the
rules set that population's parameters instead:

    ad_load_<pop>     "ad load"           (a multiplier of the global ad load)
    reminders_<pop>   "remind"

The last rule in document order that names a parameter and a level sets it; a rule naming
no known parameter or level (or a population parameter outside its section) does nothing;
unset parameters keep `AdParams()` defaults.
"""

from __future__ import annotations

from typing import Protocol

from policyopt.envs.ads.adsim.params import AdParams
from policyopt.envs.ads.adsim.world import POP_WORDS
from policyopt.envs.ads.skilldoc.document import SkillDocument

PARAM_WORDS = (
    ("ad_load", ("ad load",)),
    ("quality_weight", ("quality",)),
    ("pacing_rate", ("pac",)),
    ("exploration_rate", ("explor",)),
    ("frequency_cap", ("repeat", "frequency")),
    ("reserve_price", ("reserve",)),
)
# in a population's section: parameter prefix -> its words
POP_PARAM_WORDS = (("ad_load", ("ad load",)), ("reminders", ("remind",)))
LEVELS = (("very low", 0.05), ("very high", 0.95), ("low", 0.25), ("medium", 0.5), ("high", 0.75))


class LowerAgent(Protocol):
    """What the upper level edits for: a frozen map from a document to parameters in range."""

    def __call__(self, doc: SkillDocument) -> AdParams: ...


def rule_setting(rule: str, section: str = "") -> tuple[str, float] | None:
    """(parameter, fraction of its range) a rule of `section` sets, or None."""
    text = rule.lower()
    if section in POP_WORDS:
        prefix = next((p for p, words in POP_PARAM_WORDS if any(w in text for w in words)), None)
        param = None if prefix is None else f"{prefix}_{section}"
    else:
        param = next((p for p, words in PARAM_WORDS if any(w in text for w in words)), None)
    level = next((f for word, f in LEVELS if word in text), None)
    if param is None or level is None:
        return None
    return param, level


class RuleAgent:
    """The deterministic rule interpreter (module docstring)."""

    def __call__(self, doc: SkillDocument) -> AdParams:
        fractions: dict[str, float] = {}
        for section, rule in doc.all_rules():
            setting = rule_setting(rule, section)
            if setting is not None:
                fractions[setting[0]] = setting[1]
        return AdParams.from_fractions(fractions)
