"""The edit grammar of a skill document, for constrained decoding (`rollout.grammar`).

`edit_ebnf(doc, content)` is an xgrammar EBNF whose every string parses
(`document.read_edit`) as an "ok" edit of `doc`: one of the three edit forms, a section of
`doc`, a rule number in range (replace, delete), insert only into a section with room, a
rule, and the line's newline. The rule is, with `content`:

- "rules" (grammar `skill_rule`, the `dmrl` recipe's): a phrase of the section's parameters
  and a level ("set quality weight low"), so that every inserted or replaced rule sets a
  parameter for the rule agent (`rule_agent.rule_setting`). A section of the starting
  document admits its own parameters' phrases (`scripted.PHRASES`), a population's section
  its per-population ones, any other section the global ones.
- "free" (grammar `skill_edit`): any allowed characters, starting with a non-space, at most
  `MAX_RULE_CHARS` long. The lab record (studies/record.md, issue 20) measured why that is not the default: edits parse but the
  rules are garbled ("cap repeadged adsers meium"), name no level, and do nothing.

Both are subsets of what `parse_edit` accepts and hold every edit the editor is trained to
write (`scripted.scripted_edit`). The document is read back from the prompt
(`env.render_prompt` starts with `doc.render()`).
"""

from __future__ import annotations

import json

from policyopt.envs.ads.adsim.world import POP_WORDS
from policyopt.envs.ads.skilldoc.document import (
    MAX_RULE_CHARS,
    MAX_RULES_PER_SECTION,
    SkillDocument,
    parse_document,
)
from policyopt.envs.ads.skilldoc.scripted import LEVEL_WORDS, PHRASES
from policyopt.rollout.grammar import GRAMMARS

# `document._CONTENT_OK`'s characters; the first one may not be a space
_FIRST = r"[a-z0-9,.%+\-]"
_REST = r"[a-z0-9 ,.%+\-]"


def _alternatives(options: list[str]) -> str:
    return "(" + " | ".join(options) + ")"


CONTENTS = ("rules", "free")


def _phrases(section: str) -> list[str]:
    """The phrases of the rules the rule agent reads in `section` (module docstring)."""
    own = sorted({phrase for sec, phrase in PHRASES.values() if sec == section})
    if own:
        return own
    if section in POP_WORDS:  # a population section the start left empty
        return sorted({phrase for sec, phrase in PHRASES.values() if sec in POP_WORDS})
    return sorted({phrase for sec, phrase in PHRASES.values() if sec not in POP_WORDS})


def edit_ebnf(doc: SkillDocument, content: str = "rules") -> str:
    """The grammar of the well-formed edits of `doc` (module docstring)."""
    if content not in CONTENTS:
        raise ValueError(f"edit grammar content must be one of {CONTENTS}, got {content!r}")
    forms, lines = [], []
    levels = _alternatives([json.dumps(w) for w in LEVEL_WORDS])
    for i, (name, rules) in enumerate(doc.sections):
        quoted = json.dumps(name)
        rule = "content" if content == "free" else f"rule{i}"
        if content == "rules":
            phrases = _alternatives([json.dumps(p) for p in _phrases(name)])
            lines.append(f'{rule} ::= {phrases} " " levels')
        if len(rules) < MAX_RULES_PER_SECTION:
            forms.append(f'"insert " {quoted} ": " {rule}')
        if rules:
            numbers = _alternatives([f'"{n}"' for n in range(1, len(rules) + 1)])
            forms.append(f'"replace " {quoted} " " {numbers} ": " {rule}')
            forms.append(f'"delete " {quoted} " " {numbers}')
    if not forms:
        raise ValueError("the skill document has no section: no edit is well-formed")
    if content == "free":
        lines.append(f"content ::= {_FIRST} {_REST}{{0,{MAX_RULE_CHARS - 1}}}")
    else:
        lines.append(f"levels ::= {levels}")
    return "\n".join(['root ::= edit "\\n"', "edit ::= " + " | ".join(forms), *lines])


def prompt_document(prompt_text: str) -> SkillDocument:
    """The document of an editor prompt: from its first section header to the "recent:"
    line. The engine hands the decoded prompt, so with `model.chat_template` the template's
    role words come before it."""
    head = prompt_text.split("\nrecent:", 1)[0]
    lines = head.split("\n")
    first = next((i for i, x in enumerate(lines) if x.startswith("[") and x.endswith("]")), None)
    if first is None:
        raise ValueError(f"no skill document (no [section] line) in the prompt {head[:80]!r}")
    return parse_document("\n".join(lines[first:]))


@GRAMMARS.register("skill_rule")
class SkillRuleGrammar:
    """The edits of the document in each prompt, rules from the agent's vocabulary."""

    def ebnf(self, prompt_text: str) -> str:
        return edit_ebnf(prompt_document(prompt_text), "rules")


@GRAMMARS.register("skill_edit")
class SkillEditGrammar:
    """The edits of the document in each prompt, rules of free characters."""

    def ebnf(self, prompt_text: str) -> str:
        return edit_ebnf(prompt_document(prompt_text), "free")
