"""The edit grammar of a skill document, for constrained decoding (`rollout.grammar`).

`edit_ebnf(doc)` is an xgrammar EBNF whose every string parses (`document.read_edit`) as an
"ok" edit of `doc`: one of the three edit forms, a section of `doc`, a rule number in range
(replace, delete), insert only into a section with room, content of allowed characters
starting with a non-space and at most `MAX_RULE_CHARS` long, and the line's newline. It is a
subset of what `parse_edit` accepts (no leading or doubled spaces), which is all the editor
is trained to write (`scripted.scripted_edit`). Registered as grammar `skill_edit`: the
document is read back from the prompt (`env.render_prompt` starts with `doc.render()`).
"""

from __future__ import annotations

import json

from policyopt.rollout.grammar import GRAMMARS
from policyopt.tasks.skilldoc.document import (
    MAX_RULE_CHARS,
    MAX_RULES_PER_SECTION,
    SkillDocument,
    parse_document,
)

# `document._CONTENT_OK`'s characters; the first one may not be a space
_FIRST = r"[a-z0-9,.%+\-]"
_REST = r"[a-z0-9 ,.%+\-]"


def _alternatives(options: list[str]) -> str:
    return "(" + " | ".join(options) + ")"


def edit_ebnf(doc: SkillDocument) -> str:
    """The grammar of the well-formed edits of `doc` (module docstring)."""
    forms = []
    for name, rules in doc.sections:
        quoted = json.dumps(name)
        if len(rules) < MAX_RULES_PER_SECTION:
            forms.append(f'"insert " {quoted} ": " content')
        if rules:
            numbers = _alternatives([f'"{n}"' for n in range(1, len(rules) + 1)])
            forms.append(f'"replace " {quoted} " " {numbers} ": " content')
            forms.append(f'"delete " {quoted} " " {numbers}')
    if not forms:
        raise ValueError("the skill document has no section: no edit is well-formed")
    return "\n".join(
        [
            'root ::= edit "\\n"',
            "edit ::= " + " | ".join(forms),
            f"content ::= {_FIRST} {_REST}{{0,{MAX_RULE_CHARS - 1}}}",
        ]
    )


def prompt_document(prompt_text: str) -> SkillDocument:
    """The document at the start of an editor prompt (up to its "recent:" line)."""
    head = prompt_text.split("\nrecent:", 1)[0]
    return parse_document(head)


@GRAMMARS.register("skill_edit")
class SkillEditGrammar:
    """The edit grammar of the document in each prompt."""

    def ebnf(self, prompt_text: str) -> str:
        return edit_ebnf(prompt_document(prompt_text))
