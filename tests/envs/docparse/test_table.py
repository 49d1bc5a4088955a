"""The table reward: hand-worked TEDS values, equality with an independent PubTabNet TEDS (apted
over lxml trees, written here) and with the reference package when installed, the weighted
costs, and fuzzing."""

import random
import string
import time

import pytest
from apted import APTED, Config
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import html

from policyopt.envs.docparse import table as docparse_table
from policyopt.envs.docparse.table import parse_html_table, table_reward, teds


def tbl(*rows: str) -> str:
    return "<table>" + "".join(f"<tr>{r}</tr>" for r in rows) + "</table>"


# --- An independent PubTabNet TEDS (Zhong et al. 2020): apted, unit costs, td cells. ------


class Cell:
    def __init__(self, tag, colspan, rowspan, content, children):
        self.tag, self.colspan, self.rowspan = tag, colspan, rowspan
        self.content, self.children = content, children


class PubTabNet(Config):
    def rename(self, a, b):
        if (a.tag, a.colspan, a.rowspan) != (b.tag, b.colspan, b.rowspan):
            return 1.0
        if a.tag == "td" and (a.content or b.content):
            return levenshtein(a.content, b.content) / max(len(a.content), len(b.content))
        return 0.0

    def children(self, node):
        return node.children


def levenshtein(a, b):
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def cell_tokens(node, top=True):
    out = [] if top else [f"<{node.tag}>"]
    out += list(node.text or "")
    for child in node:
        out += cell_tokens(child, top=False)
    if not top:
        out.append(f"</{node.tag}>")
        out += list(node.tail or "")
    return out


def to_tree(node):
    if node.tag == "td":
        span = int(node.get("colspan", "1")), int(node.get("rowspan", "1"))
        return Cell("td", *span, cell_tokens(node), [])
    return Cell(node.tag, None, None, None, [to_tree(c) for c in node])


def reference_teds(pred, ref):
    a, b = (to_tree(html.fromstring(s)) for s in (pred, ref))

    def size(t):
        return 1 + sum(size(c) for c in t.children)

    return 1.0 - APTED(a, b, PubTabNet()).compute_edit_distance() / max(size(a), size(b))


def random_table_pair(rng, rows, cols):
    """A reference table and a prediction with a few edits: text, spans, dropped cells,
    bold, duplicated rows; a thead half of the time."""

    def text():
        return "".join(rng.choice(string.ascii_letters + " .") for _ in range(rng.randint(0, 7)))

    ref = [[f"<td>{text()}</td>" for _ in range(cols)] for _ in range(rows)]
    pred = [list(r) for r in ref]
    for _ in range(rng.randint(0, 4)):
        r = pred[rng.randrange(len(pred))]
        j = rng.randrange(len(r))
        kind = rng.choice(["text", "span", "drop", "bold", "dup"])
        if kind == "text":
            r[j] = f"<td>{text()}</td>"
        elif kind == "span":
            r[j] = f'<td colspan="2" rowspan="{rng.randint(1, 2)}">{text()}</td>'
        elif kind == "drop" and len(r) > 1:
            r.pop(j)
        elif kind == "bold":
            r[j] = f"<td><b>{text()}</b>{text()}</td>"
        elif kind == "dup":
            pred.append(list(r))
    head = rng.random() < 0.5

    def render(table):
        rows_html = ["<tr>" + "".join(r) + "</tr>" for r in table]
        if head:
            return f"<table><thead>{rows_html[0]}</thead><tbody>{''.join(rows_html[1:])}</tbody></table>"
        return f"<table><tbody>{''.join(rows_html)}</tbody></table>"

    return render(pred), render(ref)


# --- Hand-worked values ----------------------------------------------------------------

TWO_BY_TWO = tbl("<td>a</td><td>b</td>", "<td>c</td><td>d</td>")  # 7 nodes


def test_identical_tables_score_one_and_content_edits_by_hand():
    assert teds(TWO_BY_TWO, TWO_BY_TWO) == 1.0
    # 'd' -> 'x': one cell at normalised distance 1 over 7 nodes.
    assert teds(tbl("<td>a</td><td>b</td>", "<td>c</td><td>x</td>"), TWO_BY_TWO) == pytest.approx(
        1 - 1 / 7
    )
    # 'abcd' vs 'abxd': distance 1/4 on a 3-node table (table, tr, td) -> 1 - 0.25/3.
    assert teds(tbl("<td>abcd</td>"), tbl("<td>abxd</td>")) == pytest.approx(1 - 0.25 / 3)
    # Inline tags are tokens: <b>ab</b> = [<b>, a, b, </b>] vs [a, b]: 2/4 -> 1 - 0.5/3.
    assert teds(tbl("<td><b>ab</b></td>"), tbl("<td>ab</td>")) == pytest.approx(1 - 0.5 / 3)


def test_structure_edits_by_hand_unit_and_weighted():
    merged = tbl('<td colspan="2">a</td>', "<td>c</td><td>d</td>")  # 6 nodes vs 7
    # Unit: delete td(b) 1 + relabel td(a) -> td colspan=2 1 = 2 -> 1 - 2/7.
    assert teds(merged, TWO_BY_TWO) == pytest.approx(1 - 2 / 7)
    # Weighted (structure 2, content 1): 2 + 2 = 4 -> 1 - 4/7.
    assert table_reward(merged, TWO_BY_TWO) == pytest.approx(1 - 4 / 7)
    missing = tbl("<td>a</td><td>b</td>", "<td>c</td>")  # one cell fewer: delete 1 node
    assert teds(missing, TWO_BY_TWO) == pytest.approx(1 - 1 / 7)
    assert table_reward(missing, TWO_BY_TWO) == pytest.approx(1 - 2 / 7)
    # Content errors cost content_cost x distance: weighted equals unit for them.
    wrong_text = tbl("<td>a</td><td>b</td>", "<td>c</td><td>x</td>")
    assert table_reward(wrong_text, TWO_BY_TWO) == pytest.approx(1 - 1 / 7)
    assert table_reward(wrong_text, TWO_BY_TWO, content_cost=0.5) == pytest.approx(1 - 0.5 / 7)
    # Clipped at 0: an empty table against 7 nodes costs 6 deletions x 2 > 7.
    assert table_reward("<table></table>", TWO_BY_TWO) == 0.0
    assert teds("<table></table>", TWO_BY_TWO) == pytest.approx(1 / 7)


def test_th_cells_have_their_content_compared():
    assert teds(tbl("<th>a</th>"), tbl("<th>b</th>")) == pytest.approx(1 - 1 / 3)
    assert teds(tbl("<th>a</th>"), tbl("<td>a</td>")) == pytest.approx(1 - 1 / 3)


def test_no_table_malformed_and_surroundings():
    assert table_reward("", "") == 0.0
    assert table_reward("plain text", TWO_BY_TWO) == 0.0
    assert table_reward(TWO_BY_TWO, "no table here") == 0.0
    assert table_reward("<table", TWO_BY_TWO) == 0.0
    # A table inside prose, and an unclosed table, parse to the same tree.
    assert table_reward(f"Here it is: {TWO_BY_TWO} done.", TWO_BY_TWO) == 1.0
    assert table_reward("<table><tr><td>a<td>b<tr><td>c<td>d", TWO_BY_TWO) == 1.0
    # Malformed spans are labels, not errors.
    assert teds(tbl('<td colspan="x">a</td>'), tbl("<td>a</td>")) == pytest.approx(1 - 1 / 3)
    with pytest.raises(TypeError, match="prediction"):
        table_reward(None, TWO_BY_TWO)
    with pytest.raises(ValueError, match="structure_cost"):
        table_reward(TWO_BY_TWO, TWO_BY_TWO, structure_cost=0.0)


def test_huge_tables_fall_back_to_sequence_similarity(monkeypatch, caplog):
    monkeypatch.setattr(docparse_table, "MAX_NODE_PAIRS", 8)
    # 3 x 3 nodes > 8: sequences [a, td, tr, table] vs [b, td, tr, table]: 1 edit of 4.
    assert teds(tbl("<td>a</td>"), tbl("<td>b</td>")) == pytest.approx(0.75)
    assert "MAX_NODE_PAIRS" in caplog.text


def test_deep_nesting_does_not_hit_the_recursion_limit():
    deep = "<table><tr><td>" + "<b>" * 3000 + "x" + "</b>" * 3000 + "</td></tr></table>"
    assert 0.0 <= table_reward(deep, tbl("<td>x</td>")) <= 1.0
    nested = "<table><tr><td>" * 300 + "</td></tr></table>" * 300
    assert 0.0 <= table_reward(nested, nested) <= 1.0


# --- Equality with PubTabNet TEDS ------------------------------------------------------


def test_unit_costs_equal_independent_pubtabnet_teds_on_random_tables():
    rng = random.Random(0)
    for _ in range(40):
        pred, ref = random_table_pair(rng, rng.randint(1, 4), rng.randint(1, 4))
        assert teds(pred, ref) == pytest.approx(reference_teds(pred, ref), abs=1e-9)


def test_unit_costs_equal_the_reference_package():
    reference = pytest.importorskip("table_recognition_metric").TEDS()
    rng = random.Random(1)
    for _ in range(15):
        pred, ref = random_table_pair(rng, rng.randint(2, 5), rng.randint(2, 5))
        # The reference only finds a table at body/table.
        expected = reference(
            f"<html><body>{pred}</body></html>", f"<html><body>{ref}</body></html>"
        )
        assert teds(pred, ref) == pytest.approx(expected, abs=1e-9)


# --- Fuzzing ---------------------------------------------------------------------------

HTMLISH = st.lists(
    st.sampled_from(
        [
            "<table>",
            "</table>",
            "<tr>",
            "</tr>",
            "<td>",
            "</td>",
            '<td colspan="2">',
            "<th>",
            "<thead>",
            "<tbody>",
            "<b>",
            "</b>",
            "a",
            "b",
            " ",
            "<",
            ">",
            "&amp;",
            "<!-- c -->",
            "\x00",
            '<td rowspan="-1">',
            "<?xml version='1.0' encoding='utf-8'?>",
        ]
    ),
    max_size=30,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.one_of(HTMLISH, st.text()), st.one_of(HTMLISH, st.text()))
def test_fuzz_in_unit_interval_symmetric_and_one_on_itself(a, b):
    r = table_reward(a, b)
    assert 0.0 <= r <= 1.0
    assert r == pytest.approx(table_reward(b, a), abs=1e-12)  # costs and normaliser are symmetric
    assert table_reward(a, a) == (1.0 if parse_html_table(a) is not None else 0.0)


# --- Time limit -----------------------------------------------------------------------------


def grid(n_rows: int, n_cols: int) -> str:
    return tbl(*("".join(f"<td>{i * j}</td>" for j in range(n_cols)) for i in range(n_rows)))


def test_a_pair_over_the_time_limit_scores_a_logged_zero_and_the_worker_recovers(caplog):
    # Two 40 x 48 tables: the exact distance takes seconds (~6 s here), so 0.3 s runs out.
    big_a, big_b = grid(40, 48), grid(48, 40)
    docparse_table._worker([tbl("<td>1</td>"), tbl("<td>1</td>"), 2.0, 1.0], 60.0)  # started
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="policyopt.envs.docparse.table"):
        assert table_reward(big_a, big_b, timeout_s=0.3) == 0.0
    assert time.monotonic() - start < 10
    assert "no result within 0.3 s" in caplog.text
    assert not docparse_table._worker.alive()  # killed
    # The next long pair gets a new worker; its value is the in-process one.
    long_a = grid(6, 6) + " " * docparse_table.IN_PROCESS_CHARS
    expected = table_reward(long_a, grid(6, 7), timeout_s=None)
    assert table_reward(long_a, grid(6, 7), timeout_s=30.0) == expected
    assert docparse_table._worker.alive()


def test_short_pairs_score_in_process_and_long_ones_in_the_worker_with_equal_values():
    pairs = [(grid(3, 3), grid(3, 4)), (grid(2, 2) + "<b>x</b>", grid(2, 2))]
    for pred, ref in pairs:
        padded = pred + " " * docparse_table.IN_PROCESS_CHARS  # same table, now long
        assert table_reward(padded, ref, timeout_s=30.0) == table_reward(pred, ref)
        assert teds(padded, ref, timeout_s=30.0) == teds(pred, ref)
    with pytest.raises(ValueError, match="timeout_s"):
        table_reward("<table></table>", "<table></table>", timeout_s=0)
