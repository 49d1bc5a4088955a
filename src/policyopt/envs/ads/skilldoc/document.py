"""The skill document: named sections of natural-language rules, and atomic edits to it.

Text form (what the editor reads in its prompt):

    [ads]
    1. keep ad load very high
    2. cap repeated ads high
    [ranking]
    1. set quality weight low

An edit e = (location, action, content) is written on one line, in one of three forms:

    insert SECTION: CONTENT          append a rule at the end of SECTION
    replace SECTION N: CONTENT       replace rule N (1-based) of SECTION
    delete SECTION N                 delete rule N of SECTION

`parse_edit` returns None for anything else (unknown action or section, a rule number out of
range, empty or over-long content). An edit is complete only when its line ends with a
newline: `read_edit` calls a completion without one "truncated" (it hit the token budget, or
stopped mid-line) and never applies it, whatever its prefix would parse as; otherwise
"malformed" when `parse_edit` rejects it, "ok" when it parses. The reward function scores
truncated and malformed edits as "no change" minus a bounded penalty and counts them apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_RULE_CHARS = 60
MAX_RULES_PER_SECTION = 4
_EDIT = re.compile(
    r"^\s*(?:(?P<ins>insert) (?P<isec>[a-z]+):\s*(?P<icontent>.+?)"
    r"|(?P<rep>replace) (?P<rsec>[a-z]+) (?P<rnum>\d+):\s*(?P<rcontent>.+?)"
    r"|(?P<dele>delete) (?P<dsec>[a-z]+) (?P<dnum>\d+))\s*$"
)
_CONTENT_OK = re.compile(r"^[a-z0-9 ,.%+\-]+$")


@dataclass(frozen=True)
class Edit:
    section: str
    action: str  # insert | replace | delete
    index: int  # 0-based rule index (for insert: the new rule's position)
    content: str  # "" for delete

    def text(self) -> str:
        if self.action == "insert":
            return f"insert {self.section}: {self.content}"
        if self.action == "replace":
            return f"replace {self.section} {self.index + 1}: {self.content}"
        return f"delete {self.section} {self.index + 1}"


@dataclass(frozen=True)
class EditSequence:
    """Edits made one after another (an editor episode's well-formed edits), deployed as one
    change; its text is theirs, joined by "; "."""

    edits: tuple[Edit, ...]

    def text(self) -> str:
        return "; ".join(e.text() for e in self.edits)


@dataclass(frozen=True)
class SkillDocument:
    sections: tuple[tuple[str, tuple[str, ...]], ...]  # (name, rules) in order

    @staticmethod
    def from_dict(sections: dict[str, list[str]]) -> SkillDocument:
        return SkillDocument(tuple((k, tuple(v)) for k, v in sections.items()))

    def rules(self, section: str) -> tuple[str, ...]:
        for name, rules in self.sections:
            if name == section:
                return rules
        raise KeyError(f"skill document has no section {section!r}; sections: {self.names()}")

    def names(self) -> list[str]:
        return [name for name, _ in self.sections]

    def all_rules(self) -> list[tuple[str, str]]:
        """(section, rule) pairs in document order."""
        return [(name, r) for name, rules in self.sections for r in rules]

    def section_text(self, section: str) -> str:
        return "\n".join(self.rules(section))

    def render(self) -> str:
        lines = []
        for name, rules in self.sections:
            lines.append(f"[{name}]")
            lines.extend(f"{i}. {r}" for i, r in enumerate(rules, 1))
        return "\n".join(lines)

    def apply(self, edit: Edit | EditSequence) -> SkillDocument:
        if isinstance(edit, EditSequence):
            doc = self
            for e in edit.edits:
                doc = doc.apply(e)
            return doc
        out = []
        for name, rules in self.sections:
            if name == edit.section:
                r = list(rules)
                if edit.action == "insert":
                    r.insert(edit.index, edit.content)
                elif edit.action == "replace":
                    r[edit.index] = edit.content
                else:
                    del r[edit.index]
                rules = tuple(r)
            out.append((name, rules))
        return SkillDocument(tuple(out))


def parse_edit(text: str, doc: SkillDocument) -> Edit | None:
    """The edit written in the first line of `text`, checked against `doc`; None if malformed."""
    line = text.strip().split("\n", 1)[0] if text.strip() else ""
    m = _EDIT.match(line)
    if m is None:
        return None
    if m["ins"]:
        section, action, content, number = m["isec"], "insert", m["icontent"], None
    elif m["rep"]:
        section, action, content, number = m["rsec"], "replace", m["rcontent"], int(m["rnum"])
    else:
        section, action, content, number = m["dsec"], "delete", "", int(m["dnum"])
    if section not in doc.names():
        return None
    rules = doc.rules(section)
    if action == "insert":
        if len(rules) >= MAX_RULES_PER_SECTION:
            return None
        index = len(rules)
    else:
        assert number is not None
        if not 1 <= number <= len(rules):
            return None
        index = number - 1
    content = content.strip()
    if action != "delete" and (
        not content or len(content) > MAX_RULE_CHARS or not _CONTENT_OK.match(content)
    ):
        return None
    return Edit(section, action, index, content)


EDIT_STATUSES = ("ok", "malformed", "truncated")


def read_edit(text: str, doc: SkillDocument) -> tuple[Edit | None, str]:
    """(edit, status) of a completion (module docstring): status in `EDIT_STATUSES`."""
    if "\n" not in text.lstrip():
        return None, "truncated"
    edit = parse_edit(text, doc)
    return edit, "ok" if edit is not None else "malformed"


def parse_document(text: str) -> SkillDocument:
    """The inverse of `SkillDocument.render`."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections[current] = []
        elif current is not None and ". " in line:
            sections[current].append(line.split(". ", 1)[1])
        else:
            raise ValueError(f"skill document: cannot read line {line!r}")
    return SkillDocument.from_dict(sections)
