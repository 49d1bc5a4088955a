"""The document-parsing task: renderers on hand-made elements, noise, determinism, disjoint
splits, every reference scoring 1.0 with its own type's reward, the verifier's conventions."""

import random
import re
from collections import Counter

import pytest

from policyopt.envs.docparse.reward import docparse_reward_function
from policyopt.envs.docparse.task import (
    MAX_REFERENCE_CHARS,
    DocParseTask,
    _table_html,
    _table_scan,
    latex,
    make_element,
    ocr_noise,
    output_style,
    spoken,
    wrap,
)
from policyopt.tasks import TASKS, get_task


def small(**options):
    return DocParseTask(**{"train_size": 90, "eval_size": 45, **options})


# ------------------------------------------------------------------ renderers, by hand


def test_wrap_cuts_long_words_with_a_hyphen():
    # width 12: "The scanner" (11) fits; "loads" goes down; "columns" (7) does not fit after
    # "loads two" (9 + 1 space): room 2, cut 1 < 2, so it moves down whole.
    assert wrap("The scanner loads two columns", 12) == "The scanner\nloads two\ncolumns"
    # "merges" (6) after "Leo": room 10 - 3 - 1 = 6, fits; "numbers." does not, and a full
    # line leaves no room to cut it: it moves down whole.
    assert wrap("Leo merges numbers.", 10) == "Leo merges\nnumbers."
    # width 9: "labels" (6) after "Sam": room 9 - 3 - 1 = 5 < 6, so 5 - 1 = 4 characters and
    # the hyphen stay ("labe-"), the other 2 go down.
    assert wrap("Sam labels it", 9) == "Sam labe-\nls it"


def test_table_html_and_scan_with_spans():
    cells = [
        [("id", 1, 1), ("kg", 2, 1), None],  # kg spans columns 1-2
        [("7", 1, 2), ("ok", 1, 1), ("12", 1, 1)],  # 7 spans rows 1-2
        [None, ("a", 1, 1), ("max", 1, 1)],
    ]
    assert _table_html(cells) == (
        '<table><tr><td>id</td><td colspan="2">kg</td></tr>'
        '<tr><td rowspan="2">7</td><td>ok</td><td>12</td></tr>'
        "<tr><td>a</td><td>max</td></tr></table>"
    )
    # Column widths 2, 2, 3 (single-column cells only); the colspan takes 2 + 1 + 3 = 6.
    assert _table_scan(cells, 3) == "id|kg\n7 |ok|12\n  |a |max"


def test_formula_latex_and_spoken_forms():
    x, one, two = ("var", "x"), ("num", "1"), ("num", "2")
    poly = ("add", [("+", ("pow", x, two)), ("+", ("mul", two, x)), ("+", one)])
    assert latex(poly) == "x^{2}+2x+1"
    assert spoken(poly) == "x squared plus 2 x plus 1"
    frac = ("frac", ("var", "a"), ("var", "b"))
    assert (latex(frac), spoken(frac)) == ("\\frac{a}{b}", "frac a over b")
    nested = ("eq", ("var", "y"), ("sqrt", ("add", [("+", x), ("-", ("sub", "t", "1"))])))
    assert latex(nested) == "y=\\sqrt{x-t_{1}}"
    assert spoken(nested) == "y equals sqrt (x minus t sub 1)"
    greek = ("prod", ("greek", "alpha"), x)
    assert (latex(greek), spoken(greek)) == ("\\alpha x", "alpha x")
    power = ("pow", ("add", [("+", x), ("+", one)]), ("var", "n"))
    assert (latex(power), spoken(power)) == ("(x+1)^{n}", "(x plus 1) to the n")


# ------------------------------------------------------------------ noise


def test_noise_never_touches_formula_symbols_but_does_table_cells():
    rng = random.Random(0)
    plain = "1 0 5 1"  # every character is confusable in a table, none is in a formula
    assert ocr_noise(plain, rng, 0, "formula") == plain
    for _ in range(20):
        assert ocr_noise(plain, rng, 3, "formula").replace(" ", "") == "1051"
    assert any(ocr_noise(plain, rng, 3, "table").replace(" ", "") != "1051" for _ in range(20))
    # Spoken words are confusable: "plus" -> p1us / pIus / plvs.
    noisy = {ocr_noise("plus", random.Random(s), 1, "formula") for s in range(30)}
    assert noisy == {"p1us", "pIus", "plvs"}


@pytest.mark.parametrize("element_type", ["text", "table", "formula"])
def test_scan_differs_from_plain_rendering(element_type):
    rng = random.Random(1)
    for level in (1, 2, 3):
        draws = [make_element(rng, element_type, level) for _ in range(50)]
        changed = sum(scan != plain for _, plain, scan in draws)
        assert changed >= 48, (element_type, level, changed)
        if element_type == "text" and level == 1:
            assert all(plain == ref for ref, plain, _ in draws)  # one clean line


# ------------------------------------------------------------------ rows and splits


def test_registered_and_row_columns():
    assert "docparse" in TASKS
    task = get_task("docparse", seed=3, train_size=12, eval_size=6)
    assert isinstance(task, DocParseTask)
    rows = task.rows("train")
    assert len(rows) == 12 and len(task.rows("eval")) == 6
    for row in rows:
        assert row["prompt"] == task.format_prompt(row)
        assert row["prompt"] == f"SCAN[{row['element_type']}]:\n{row['scan']}\nMARKUP:\n"
        assert row["solution"] == row["reference"]
        assert task.expert_solutions(row) == [row["reference"]]


def test_same_seed_same_rows_other_seed_other_rows():
    a, b, c = small(seed=1), small(seed=1), small(seed=2)
    for split in ("train", "eval"):
        assert a.rows(split).to_dict() == b.rows(split).to_dict()
        assert a.rows(split)["reference"] != c.rows(split)["reference"]


def test_splits_disjoint_eval_distinct_and_independent_of_train_size():
    task = small(seed=0)
    pairs = lambda rows: list(zip(rows["element_type"], rows["reference"], strict=True))  # noqa: E731
    train, held = set(pairs(task.rows("train"))), pairs(task.rows("eval"))
    assert not train & set(held)
    assert len(set(held)) == len(held) == 45
    assert pairs(DocParseTask(seed=0, train_size=3, eval_size=45).rows("eval")) == held


def test_type_and_level_mix_round_robin():
    rows = small().rows("train")
    combos = Counter(zip(rows["element_type"], rows["level"], strict=True))
    assert combos == {(t, k): 10 for t in ("text", "table", "formula") for k in (1, 2, 3)}
    assert rows["element_type"][:4] == ["text", "table", "formula", "text"]
    assert rows["level"][:7] == [1, 1, 1, 2, 2, 2, 3]
    only = DocParseTask(train_size=20, eval_size=4, types=["table"], levels=[3]).rows("train")
    assert set(only["element_type"]) == {"table"} and set(only["level"]) == {3}


def test_levels_shape_the_elements():
    rows = DocParseTask(train_size=300, eval_size=0, types=["table", "text"]).rows("train")
    for row in rows:
        ref, level = row["reference"], row["level"]
        assert len(ref) <= MAX_REFERENCE_CHARS
        if row["element_type"] == "table":
            n_cells = ref.count("<td")
            spans = len(re.findall(r"(col|row)span=\"2\"", ref))
            assert spans == (1 if level == 3 else 0)
            assert n_cells == {1: 4, 2: 6, 3: 5}[level]
        else:
            assert ("\n" in row["scan"]) == (level >= 2 and len(ref) > 24)
            assert len(re.findall(r"\.", ref)) == (2 if level == 3 else 1)


def test_options_are_checked():
    with pytest.raises(ValueError, match="levels"):
        DocParseTask(levels=[4])
    with pytest.raises(ValueError, match="types"):
        DocParseTask(types=["image"])
    with pytest.raises(ValueError, match="sizes"):
        DocParseTask(train_size=-1)
    with pytest.raises(ValueError, match="split"):
        small().rows("test")
    with pytest.raises(ValueError, match="ocr_text_fraction"):
        DocParseTask(ocr_text_fraction=-0.1)


# ------------------------------------------------------------------ OCR-text labels


def test_ocr_text_rows_keep_the_elements_and_imitate_their_scan():
    plain, mixed = small(), small(ocr_text_fraction=0.4)
    for split in ("train", "eval"):
        a, b = plain.rows(split), mixed.rows(split)
        for column in ("prompt", "scan", "reference", "solution", "element_type", "level"):
            assert a[column] == b[column]
        assert set(a["demo_style"]) == {"markup"}
    rows = mixed.rows("train")
    ocr_text = [r for r in rows if r["demo_style"] == "ocr_text"]
    # 90 draws at p = 0.4: within 4.5 standard deviations (4.6) of 36.
    assert 15 < len(ocr_text) < 57
    for row in ocr_text:
        assert mixed.sft_targets(row) == [row["scan"]]
        assert mixed.expert_solutions(row) == [row["reference"]]  # GAR/DATPO anchors
        score = mixed.verify(row["scan"], row)
        if row["element_type"] == "table":
            assert score == 0.0  # no <table>: the table reward's convention
        else:
            assert score < 1.0  # every scan has at least one OCR event
    markup = next(r for r in rows if r["demo_style"] == "markup")
    assert mixed.sft_targets(markup) == [markup["reference"]]


def test_output_style_tells_copied_text_layers_from_markup():
    task = small(seed=3, levels=[2, 3])  # text blocks of levels 2-3 are wrapped
    for row in task.rows("train"):
        t = row["element_type"]
        assert output_style(t, row["reference"]) == "markup", row
        assert output_style(t, row["scan"]) == "ocr_text", row
    assert output_style("formula", "pIus x") == "ocr_text"  # a word garbled by OCR
    assert output_style("formula", r"\alpha x^{2}+xy") == "markup"
    assert output_style("table", "<TABLE><tr>") == "markup"
    with pytest.raises(ValueError, match="unknown element type"):
        output_style("image", "x")


# ------------------------------------------------------------------ the verifier


def test_every_reference_scores_one_with_its_own_reward():
    task = small(seed=5)
    for split in ("train", "eval"):
        for row in task.rows(split):
            assert task.verify(row["reference"], row) == 1.0, row


def test_verify_conventions_and_agreement_with_the_reward_function():
    task = small()
    rows = task.rows("eval")
    text = next(r for r in rows if r["element_type"] == "text")
    table = next(r for r in rows if r["element_type"] == "table")
    formula = next(r for r in rows if r["element_type"] == "formula")
    assert task.verify("", text) is None and task.verify("  \n", table) is None
    ref = text["reference"]
    typo = ref[:-1] + ("!" if ref[-1] != "!" else "?")  # one substitution
    assert task.verify(typo, text) == pytest.approx(1 - 1 / len(ref))
    assert task.verify("no table here", table) == 0.0  # rewards' convention: 0, not None
    assert task.verify("\\frac{", formula) == 0.0  # LaTeX that does not parse: 0
    truncated = table["reference"][:40]
    assert 0.0 < task.verify(truncated, table) < 1.0  # lxml recovers a truncated table
    reward = docparse_reward_function("auto")
    completions = [typo, "no table here", truncated, "\\frac{", formula["reference"]]
    picked = [text, table, table, formula, formula]
    columns = {k: [r[k] for r in picked] for k in picked[0]}
    expected = [task.verify(c, r) for c, r in zip(completions, picked, strict=True)]
    assert reward([r["prompt"] for r in picked], completions, **columns) == expected
    assert task.extract_answer("  <table></table>\n") == "<table></table>"
    assert task.extract_answer(" ") is None
