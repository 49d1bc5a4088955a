"""DocPO's document-parsing task (SPEC §5): noisy plain-text "scans" of document elements,
to be turned into markup.

Three element types, in difficulty levels 1-3; each row pairs a scan with its target markup:

- text: one (levels 1, 2) or two (level 3) short sentences from a small vocabulary; the target
  is the clean text on one line. From level 2 the scan wraps it into lines of `WRAP_WIDTH`
  characters, cutting a long word at a line end with a hyphen (`sor-\\nts`).
- table: a grid of short cells, 2x2 at level 1, 2x3 or 3x2 at level 2, the same with one
  cell spanning two columns or two rows at level 3; the target is minimal HTML,
  `<table><tr><td>7</td><td colspan="2">kg</td></tr>...</table>`. The scan prints each row
  with `|` between cells and every column padded to its widest cell; a cell spanning columns
  takes their width (and the `|` between them), a place covered by a cell spanning rows from
  above is blank (generated cells are never empty, so a blank is always a span).
- formula: a small expression tree; the target is LaTeX (`x^{2}+2x+1`, `\\frac{a}{b}`), the
  scan its spoken form (`x squared plus 2 x plus 1`, `frac a over b`); an operand of frac,
  sqrt or a power that is not a single symbol or number is wrapped in parentheses in the scan
  (`frac (x plus 1) over y`), so the spoken form is unambiguous.

Sizes suit the embedded 1M-parameter character model: targets are 18-94 characters of text,
73-114 of HTML (a 3x3 table would take ~140, a 4x4 one ~220) and 3-40 of LaTeX; every
target is at most `MAX_REFERENCE_CHARS`, and prompts at most ~120 characters.

OCR noise turns the noise-free rendering (`plain`) into the scan by 1 to 5 events (more at
higher levels), each one of: a character confusion (`CONFUSIONS`: l→1/I, I→l, O→0, o→0,
m→rn, S→5, e→c, u→v, 0→O, 1→l, 5→S), a dropped space, a doubled space; in tables, a padding
space dropped or a space added after a `|` (not before, which could restore a dropped one).
Confusions never touch a formula's symbols or numbers (only its spoken words), where they
would make the target unrecoverable. Every scan has at least one event, so it differs from
its plain rendering.

OCR-text labels (`ocr_text_fraction`): in document corpora, many pages carry only the text
layer an OCR engine read, not structured markup. A row drawn as `ocr_text` (its `demo_style`)
is warm-started on that text, which is its scan as it stands (line breaks, OCR noise, `|`
columns, formulas in words), instead of the markup. The rewards still compare with the
markup, under which the raw text of a table or a formula scores (nearly) 0 and that of a text
block loses its line breaks, hyphens and noise. So a warm start on the mix holds two
behaviours, copy the text layer or convert to markup, and RL can choose between them. The
elements, scans and references do not depend on the fraction (`demo_style` has its own
random stream).

Rows: `prompt` (what `format_prompt` builds), `scan`, `reference` (target markup),
`solution` (= reference: the expert solution), `element_type`, `level` and `demo_style`
(`markup` or `ocr_text`: what SFT imitates, `sft_targets`). The eval split is drawn
first from its own random stream with distinct (type, reference) pairs; the train split from
another stream skips every eval pair, so no target appears in both, and the eval split does
not depend on `train_size`. Row i has type `types[i % T]` and level
`levels[(i // T) % L]`: every prefix of a split has the same type and level mix.

`verify` is DocPO's reward of the row's type (`policyopt.envs.docparse.reward`, default costs),
the same value as the registered `docparse` reward function; None only for an empty
completion. Anything else, including a table without `<table>` or LaTeX that does not parse,
is a legitimate 0 under the rewards' conventions.

The model side: `format_prompt(row)` is the only place where a row becomes policy input; the
rewards, the step-aware shaper and the group filter read only `reference`, `element_type`
and the completions. A vision variant (e.g. Qwen2.5-VL on GPU) subclasses this task: it adds
an `image` column (the element rendered as a picture, from the same reference, instead of
`make_element`'s noisy text) and overrides `format_prompt` to return the instruction only
(`Parse this {element_type} into markup.`); what remains is an engine that hands the row's
image to the model's processor with that text. Rewards, shaper, filter and preset stay as
they are.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import datasets

from policyopt.envs.docparse.reward import ELEMENT_TYPES, formula_reward, table_reward, text_reward
from policyopt.tasks.base import TASKS, Task
from policyopt.tasks.options import fraction, sizes, split_name, subset

LEVELS = (1, 2, 3)
WRAP_WIDTH = 24  # scan line width of text blocks from level 2
PROMPT_TEMPLATE = "SCAN[{element_type}]:\n{scan}\nMARKUP:\n"
MAX_REFERENCE_CHARS = 120  # every target fits in max_new_tokens = 121 (with EOS)

# Clean character -> what an OCR engine may read instead.
CONFUSIONS: dict[str, tuple[str, ...]] = {
    "l": ("1", "I"),
    "I": ("l",),
    "O": ("0",),
    "o": ("0",),
    "m": ("rn",),
    "S": ("5",),
    "e": ("c",),
    "u": ("v",),
    "0": ("O",),
    "1": ("l",),
    "5": ("S",),
}
# Noise events per scan, (min, max) by level.
NOISE_EVENTS = {1: (1, 2), 2: (2, 3), 3: (3, 5)}

# ------------------------------------------------------------------------------ text

SUBJECTS = (
    "the model", "a clerk", "the scanner", "our team", "the old table", "this page",
    "each line", "the parser", "my form", "the column", "a reader", "Molly", "Leo", "Olga",
    "Sam", "the editor",
)  # fmt: skip
VERBS = (
    "reads", "lists", "holds", "marks", "fills", "shows", "moves", "finds", "loads", "sorts",
    "merges", "checks", "skips", "copies", "labels", "splits",
)  # fmt: skip
OBJECTS = (
    "{n} rows", "{n} items", "the last page", "two columns", "all forms", "some formulas",
    "the main title", "small numbers", "{n} lines", "an old bill", "the summary", "more cells",
    "the problem", "its label", "a long list", "{n} pages",
)  # fmt: skip
TAILS = (
    "today", "slowly", "again", "at noon", "in full", "on time", "for Lola", "by hand",
    "in {n} minutes", "before lunch",
)  # fmt: skip


def _sentence(rng: random.Random, tail: bool) -> str:
    """`Subject verb object [tail].` with numbers 2..99 in the `{n}` slots."""
    words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
    if tail:
        words.append(rng.choice(TAILS))
    text = " ".join(w.replace("{n}", str(rng.randint(2, 99))) for w in words)
    return text[0].upper() + text[1:] + "."


def wrap(text: str, width: int) -> str:
    """Greedy line filling; a word of >= 6 characters that does not fit is cut with a hyphen
    when at least 2 of its characters fit (with the hyphen) and at least 2 go to the next line."""
    lines, line = [], ""
    for word in text.split(" "):
        while True:
            room = width - len(line) - (1 if line else 0)
            if len(word) <= room:
                line = f"{line} {word}" if line else word
                break
            cut = room - 1  # characters before the hyphen
            if len(word) >= 6 and cut >= 2 and len(word) - cut >= 2:
                lines.append(f"{line} {word[:cut]}-" if line else f"{word[:cut]}-")
                line, word = "", word[cut:]
                continue
            if not line:  # a word longer than the line: keep it whole
                line = word
                break
            lines.append(line)
            line = ""
    return "\n".join([*lines, line])


def make_text(rng: random.Random, level: int) -> tuple[str, str]:
    """(reference, plain scan) of a level-`level` text block."""
    n_sentences = 2 if level >= 3 else 1
    reference = " ".join(_sentence(rng, tail=level >= 2) for _ in range(n_sentences))
    return reference, reference if level == 1 else wrap(reference, WRAP_WIDTH)


# ------------------------------------------------------------------------------ tables

CELL_LABELS = (
    "a", "b", "x", "y", "id", "no", "ok", "OK", "kg", "ml", "lb", "cm", "mm", "min", "max",
    "sum", "avg", "top", "low", "old", "new", "Q1", "Q2", "Q3", "yes", "net", "tax", "fee",
    "day", "May", "Jun", "Sep",
)  # fmt: skip
TABLE_SHAPES = {1: ((2, 2),), 2: ((2, 3), (3, 2)), 3: ((2, 3), (3, 2))}  # (rows, columns)
_LABELS_UP_TO = {n: tuple(w for w in CELL_LABELS if len(w) <= n) for n in (2, 3)}


def _cell(rng: random.Random, max_len: int) -> str:
    """A number 0..99 or a label of at most `max_len` (2 or 3) characters."""
    if rng.random() < 0.5:
        return str(rng.randint(0, 99))
    return rng.choice(_LABELS_UP_TO[max_len])


def make_table(rng: random.Random, level: int) -> tuple[str, str]:
    """(reference HTML, plain scan) of a level-`level` table; see the module doc."""
    n_rows, n_cols = rng.choice(TABLE_SHAPES[level])
    # cells[r][c]: (text, colspan, rowspan) at a cell's top-left place, None where covered.
    cells: list[list[tuple[str, int, int] | None]] = [
        [(_cell(rng, 2 if level == 1 else 3), 1, 1) for _ in range(n_cols)] for _ in range(n_rows)
    ]
    if level >= 3:
        if rng.random() < 0.5:  # colspan 2 at (r, c), covering (r, c + 1)
            r, c = rng.randrange(n_rows), rng.randrange(n_cols - 1)
            cells[r][c] = (cells[r][c][0], 2, 1)
            cells[r][c + 1] = None
        else:  # rowspan 2 at (r, c), covering (r + 1, c)
            r, c = rng.randrange(n_rows - 1), rng.randrange(n_cols)
            cells[r][c] = (cells[r][c][0], 1, 2)
            cells[r + 1][c] = None
    return _table_html(cells), _table_scan(cells, n_cols)


def _table_html(cells: list[list[tuple[str, int, int] | None]]) -> str:
    rows = []
    for row in cells:
        tds = []
        for cell in row:
            if cell is None:
                continue
            text, colspan, rowspan = cell
            attrs = (f' colspan="{colspan}"' if colspan > 1 else "") + (
                f' rowspan="{rowspan}"' if rowspan > 1 else ""
            )
            tds.append(f"<td{attrs}>{text}</td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _table_scan(cells: list[list[tuple[str, int, int] | None]], n_cols: int) -> str:
    """Rows with `|` between cells, columns padded to their widest single-column cell."""
    width = [1] * n_cols
    for row in cells:
        for c, cell in enumerate(row):
            if cell is not None and cell[1] == 1:
                width[c] = max(width[c], len(cell[0]))
    lines = []
    for row in cells:
        parts, c = [], 0
        while c < n_cols:  # a colspan cell skips the places it covers
            cell = row[c]
            span = 1 if cell is None else cell[1]
            w = sum(width[c : c + span]) + span - 1
            text = "" if cell is None else cell[0]  # None here: covered by a rowspan
            parts.append(text.ljust(w))
            c += span
        lines.append("|".join(parts).rstrip())
    return "\n".join(lines)


# ------------------------------------------------------------------------------ formulas

VARIABLES = ("a", "b", "c", "k", "n", "t", "x", "y", "z")
GREEK = ("alpha", "beta", "theta")
POWER_WORDS = {2: "squared", 3: "cubed"}
_CONTROL_WORD_END = re.compile(r"\\[A-Za-z]+$")

# A formula is a tree of tuples:
#   ("num", "3") ("var", "x") ("greek", "alpha") ("sub", "x", "1")   atoms
#   ("add", [(sign, term), ...])  ("mul", coef, factor)  ("prod", a, b)
#   ("pow", base, exponent_atom)  ("frac", num, den)  ("sqrt", arg)  ("eq", var, rhs)
Node = tuple


def _is_atom(node: Node) -> bool:
    return node[0] in ("num", "var", "greek", "sub")


def latex(node: Node) -> str:
    """The node's LaTeX, as the target writes it."""
    kind = node[0]
    if kind in ("num", "var"):
        return node[1]
    if kind == "greek":
        return "\\" + node[1]
    if kind == "sub":
        return f"{node[1]}_{{{node[2]}}}"
    if kind == "add":
        return "".join(
            ("" if i == 0 and sign == "+" else sign) + latex(term)
            for i, (sign, term) in enumerate(node[1])
        )
    if kind in ("mul", "prod"):
        left, right = latex(node[1]), latex(node[2])
        # A control word followed by a letter needs a space: `\alpha x`, not `\alphax`.
        return left + (" " if _CONTROL_WORD_END.search(left) and right[0].isalpha() else "") + right
    if kind == "pow":
        base = latex(node[1]) if _is_atom(node[1]) else f"({latex(node[1])})"
        return f"{base}^{{{latex(node[2])}}}"
    if kind == "frac":
        return f"\\frac{{{latex(node[1])}}}{{{latex(node[2])}}}"
    if kind == "sqrt":
        return f"\\sqrt{{{latex(node[1])}}}"
    if kind == "eq":
        return f"{latex(node[1])}={latex(node[2])}"
    raise ValueError(f"unknown formula node {kind!r}")


def spoken(node: Node) -> str:
    """The node read aloud; compound operands of frac, sqrt and powers in parentheses."""
    kind = node[0]
    if kind in ("num", "var", "greek"):
        return node[1]
    if kind == "sub":
        return f"{node[1]} sub {node[2]}"
    if kind == "add":
        words = {"+": "plus", "-": "minus"}
        return " ".join(
            (spoken(t) if i == 0 else f"{words[s]} {spoken(t)}") for i, (s, t) in enumerate(node[1])
        )
    if kind in ("mul", "prod"):
        return f"{spoken(node[1])} {spoken(node[2])}"
    if kind == "pow":
        exponent = node[2]
        if exponent[0] == "num" and int(exponent[1]) in POWER_WORDS:
            return f"{_operand(node[1])} {POWER_WORDS[int(exponent[1])]}"
        return f"{_operand(node[1])} to the {spoken(exponent)}"
    if kind == "frac":
        return f"frac {_operand(node[1])} over {_operand(node[2])}"
    if kind == "sqrt":
        return f"sqrt {_operand(node[1])}"
    if kind == "eq":
        return f"{spoken(node[1])} equals {spoken(node[2])}"
    raise ValueError(f"unknown formula node {kind!r}")


def _operand(node: Node) -> str:
    return spoken(node) if _is_atom(node) else f"({spoken(node)})"


def _symbol(rng: random.Random, level: int, avoid: Node | None = None) -> Node:
    """A variable; from level 2 also a Greek letter or a subscripted variable."""
    pick = rng.random() if level >= 2 else 0.0
    if pick > 0.8:
        return ("greek", rng.choice(GREEK))
    name = rng.choice([v for v in VARIABLES if avoid is None or avoid[1] != v])
    return ("sub", name, str(rng.randint(0, 3))) if pick > 0.65 else ("var", name)


def _num(rng: random.Random, lo: int = 1, hi: int = 9) -> Node:
    return ("num", str(rng.randint(lo, hi)))


def _monomial(rng: random.Random, level: int) -> Node:
    """x, 3x, x^{2}, 2x^{3}, x^{n} or (from level 2) a product xy."""
    s = _symbol(rng, level)
    kind = rng.choice(
        ("sym", "coef", "pow", "coefpow", "prod") if level >= 2 else ("sym", "coef", "pow")
    )
    power = ("pow", s, _num(rng, 2, 4) if rng.random() < 0.8 else ("var", rng.choice("nk")))
    if kind == "coef":
        return ("mul", _num(rng, 2, 9), s)
    if kind == "pow":
        return power
    if kind == "coefpow":
        return ("mul", _num(rng, 2, 9), power)
    if kind == "prod":
        other = _symbol(rng, level, avoid=s)
        return ("prod", s, other) if other != s else s
    return s


def _poly(rng: random.Random, level: int, n_terms: int) -> Node:
    """A sum of `n_terms` monomials and numbers, the first term a monomial."""
    terms = [("+", _monomial(rng, level))]
    for _ in range(n_terms - 1):
        term = _num(rng) if rng.random() < 0.35 else _monomial(rng, level)
        terms.append((rng.choice("+-"), term))
    return ("add", terms)


def _atom(rng: random.Random, level: int) -> Node:
    return _num(rng, 2, 9) if rng.random() < 0.3 else _symbol(rng, level)


def _equation(rng: random.Random, rhs: Node) -> Node:
    """`w = rhs` with a left-hand variable that does not occur in rhs."""
    used = latex(rhs)
    return ("eq", ("var", next((v for v in "yzw" if v not in used), "s")), rhs)


def make_formula_tree(rng: random.Random, level: int) -> Node:
    """A level-`level` formula: one operation at level 1, a few at 2, nested ones at 3."""
    if level == 1:
        choice = rng.randrange(4)
        if choice == 0:
            return ("add", [("+", _monomial(rng, 1)), (rng.choice("+-"), _atom(rng, 1))])
        if choice == 1:
            power = ("pow", _symbol(rng, 1), _num(rng, 2, 4))
            return ("mul", _num(rng, 2, 9), power) if rng.random() < 0.5 else power
        if choice == 2:
            return ("frac", _atom(rng, 1), _atom(rng, 1))
        return ("sqrt", _atom(rng, 1))
    if level == 2:
        choice = rng.randrange(5)
        if choice == 0:
            return _poly(rng, 2, 3)
        if choice == 1:
            return _equation(rng, _poly(rng, 2, 2))
        if choice == 2:
            parts = [_poly(rng, 1, 2), _atom(rng, 2)]
            rng.shuffle(parts)
            return ("frac", *parts)
        if choice == 3:
            return ("sqrt", _poly(rng, 2, 2))
        return ("pow", _poly(rng, 1, 2), _num(rng, 2, 3))
    choice = rng.randrange(4)
    if choice == 0:
        return ("frac", _poly(rng, 2, 2), _poly(rng, 1, 2))
    if choice == 1:
        inner = (
            ("frac", _poly(rng, 2, 2), _atom(rng, 2))
            if rng.random() < 0.5
            else ("sqrt", _poly(rng, 2, 2))
        )
        return _equation(rng, inner)
    if choice == 2:
        return (
            "add",
            [
                ("+", ("frac", _atom(rng, 3), _atom(rng, 3))),
                (rng.choice("+-"), _monomial(rng, 3)),
                (rng.choice("+-"), _num(rng)),
            ],
        )
    return _equation(rng, _poly(rng, 3, 3))


# The words of spoken formulas: the only characters of a formula scan that OCR may confuse.
SPOKEN_WORDS = frozenset(
    ("plus", "minus", "frac", "over", "sqrt", "squared", "cubed", "to", "the", "sub", "equals", *GREEK)
)  # fmt: skip
_WORD = re.compile(r"[A-Za-z]+")


def make_formula(rng: random.Random, level: int) -> tuple[str, str]:
    """(reference LaTeX, plain spoken scan) of a level-`level` formula."""
    tree = make_formula_tree(rng, level)
    return latex(tree), spoken(tree)


# ------------------------------------------------------------------------------ noise


def ocr_noise(plain: str, rng: random.Random, n_events: int, element_type: str) -> str:
    """`plain` with `n_events` OCR events at distinct characters (module doc). Confusable
    characters: any in text and tables, only those of spoken words in formulas."""
    if element_type == "formula":
        confusable = {
            i for m in _WORD.finditer(plain) if m.group() in SPOKEN_WORDS for i in range(*m.span())
        }
    else:
        confusable = set(range(len(plain)))
    spaces = [i for i, ch in enumerate(plain) if ch == " "]
    sites = {
        "confuse": [i for i, ch in enumerate(plain) if ch in CONFUSIONS and i in confusable],
        "drop": spaces,
    }
    if element_type == "table":
        sites["pad"] = [i for i, ch in enumerate(plain) if ch == "|"]
    else:
        sites["double"] = spaces
    pieces = list(plain)
    used: set[int] = set()
    for _ in range(n_events):
        free = {kind: [i for i in where if i not in used] for kind, where in sites.items()}
        kinds = sorted(kind for kind, where in free.items() if where)
        if not kinds:
            break
        kind = rng.choice(kinds)
        i = rng.choice(free[kind])
        used.add(i)
        if kind == "confuse":
            pieces[i] = rng.choice(CONFUSIONS[plain[i]])
        else:
            pieces[i] = {"drop": "", "double": "  ", "pad": "| "}[kind]
    return "".join(pieces)


MAKERS = {"text": make_text, "table": make_table, "formula": make_formula}


def make_element(rng: random.Random, element_type: str, level: int) -> tuple[str, str, str]:
    """(reference markup, plain rendering, noisy scan) of one element; references longer
    than `MAX_REFERENCE_CHARS` are redrawn."""
    while True:
        reference, plain = MAKERS[element_type](rng, level)
        if len(reference) <= MAX_REFERENCE_CHARS:
            break
    scan = ocr_noise(plain, rng, rng.randint(*NOISE_EVENTS[level]), element_type)
    return reference, plain, scan


# A word of 3+ letters that is not a LaTeX command: targets have only one- and two-letter
# symbol runs (`xy`), spoken scans always words (`plus`, `over`, also when OCR garbled them).
_SPOKEN_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")


def output_style(element_type: str, completion: str) -> str:
    """ "ocr_text" for a completion that copies the text layer rather than converting it
    (a table without `<table`, a formula with a word of 3+ letters that is not a LaTeX
    command, such as `over` or a garbled `pIus`, a text block that keeps the scan's line breaks), else
    "markup"; what the `ocr_text_fraction` warm start mixes and RL chooses between."""
    if element_type == "table":
        return "markup" if "<table" in completion.lower() else "ocr_text"
    if element_type == "formula":
        return "ocr_text" if _SPOKEN_WORD.search(completion) else "markup"
    if element_type == "text":
        return "ocr_text" if "\n" in completion.strip() else "markup"
    raise ValueError(f"output_style: unknown element type {element_type!r}")


def render_prompt(element_type: str, scan: str) -> str:
    """The policy's input: `SCAN[table]:\\n<scan>\\nMARKUP:\\n`."""
    return PROMPT_TEMPLATE.format(element_type=element_type, scan=scan)


# ------------------------------------------------------------------------------ the task

SCORERS = {"text": text_reward, "table": table_reward, "formula": formula_reward}


@TASKS.register("docparse")
class DocParseTask(Task):
    """Noisy scans of text blocks, tables and formulas to markup; see the module doc."""

    name = "docparse"
    prompt_column = "prompt"
    answer_column = "reference"
    solution_column = "solution"
    eval_group_column = "element_type"
    styles = ("markup", "ocr_text")

    def __init__(
        self,
        seed: int = 0,
        train_size: int = 20000,
        eval_size: int = 300,
        levels: Sequence[int] = LEVELS,
        types: Sequence[str] = ELEMENT_TYPES,
        ocr_text_fraction: float = 0.0,
    ) -> None:
        self.levels = [int(k) for k in subset("docparse", "levels", levels, LEVELS)]
        self.types = [str(t) for t in subset("docparse", "types", types, ELEMENT_TYPES)]
        sizes("docparse", train_size, eval_size)
        self.ocr_text_fraction = fraction("docparse", "ocr_text_fraction", ocr_text_fraction)
        self.seed = seed
        self.train_size = train_size
        self.eval_size = eval_size
        self._splits: dict[str, datasets.Dataset] | None = None

    def rows(self, split: str) -> datasets.Dataset:
        split_name("docparse", split)
        if self._splits is None:
            eval_rows = self._generate("eval", self.eval_size, exclude=None)
            exclude = set(zip(eval_rows["element_type"], eval_rows["reference"], strict=True))
            train_rows = self._generate("train", self.train_size, exclude=exclude)
            self._splits = {
                "eval": datasets.Dataset.from_dict(eval_rows),
                "train": datasets.Dataset.from_dict(train_rows),
            }
        return self._splits[split]

    def _generate(
        self, split: str, size: int, exclude: set[tuple[str, str]] | None
    ) -> dict[str, list]:
        """`size` rows of `split` from its own random stream: distinct (type, reference)
        pairs with `exclude` None (eval), otherwise any pair not in `exclude` (train)."""
        rng = random.Random(f"docparse-{self.seed}-{split}")  # str seeds hash with SHA-512
        # Its own stream, so that the elements do not depend on ocr_text_fraction.
        style_rng = random.Random(f"docparse-{self.seed}-{split}-demo")
        seen: set[tuple[str, str]] = set() if exclude is None else exclude
        out: dict[str, list] = {
            k: []
            for k in (
                "prompt",
                "scan",
                "reference",
                "solution",
                "element_type",
                "level",
                "demo_style",
            )
        }
        tries, max_tries = 0, 100 * size + 10_000
        while len(out["reference"]) < size:
            i = len(out["reference"])
            element_type = self.types[i % len(self.types)]
            level = self.levels[(i // len(self.types)) % len(self.levels)]
            reference, _, scan = make_element(rng, element_type, level)
            tries += 1
            if (element_type, reference) in seen:
                if tries > max_tries:
                    raise ValueError(
                        f"docparse task: could not draw {size} {split} rows ({i} after {tries} "
                        f"draws); use a smaller eval_size"
                    )
                continue
            if exclude is None:
                seen.add((element_type, reference))
            ocr_text = style_rng.random() < self.ocr_text_fraction
            for key, value in (
                ("prompt", render_prompt(element_type, scan)),
                ("scan", scan),
                ("reference", reference),
                ("solution", reference),
                ("element_type", element_type),
                ("level", level),
                ("demo_style", "ocr_text" if ocr_text else "markup"),
            ):
                out[key].append(value)
        return out

    def sft_targets(self, row: dict[str, Any]) -> list[str]:
        """The target markup, or for an `ocr_text` row its scan as it stands: the page's OCR
        text layer (`ocr_text_fraction`, module doc)."""
        if row.get("demo_style") == "ocr_text":
            return [row["scan"]]
        return self.expert_solutions(row)

    def output_style(self, completion: str, row: dict[str, Any]) -> str:
        """ "markup" or "ocr_text" (the module's `output_style`)."""
        return output_style(row["element_type"], completion)

    def format_prompt(self, row: dict[str, Any]) -> str:
        """`SCAN[<type>]:\\n<scan>\\nMARKUP:\\n`; the model continues with the markup, then
        EOS. Override this (and add an image column) for a vision model: module doc."""
        return render_prompt(row["element_type"], row["scan"])

    def extract_answer(self, completion: str) -> str | None:
        """The markup itself (stripped), for maj@k; None when the completion is empty."""
        return completion.strip() or None

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        """DocPO's reward of the row's element type in [0, 1]; None for an empty completion."""
        if not completion.strip():
            return None
        return SCORERS[row["element_type"]](completion, row["reference"])
