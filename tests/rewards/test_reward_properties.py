"""Every shipped reward function under hostile model output (issue 13, item 14): it never
raises, returns None or a finite value in its documented range, and returns within a time
bound (the table and formula rewards through their time limits). Pattern and helpers:
`reward_properties.py`."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reward_properties import REWARD_SETTINGS, check_reward_function, hostile_text

from policyopt.envs.docparse.reward import docparse_reward_function
from policyopt.rewards import task_reward_function
from policyopt.tasks import get_task
from policyopt.tasks.arithmetic import arithmetic_format_reward

ARITHMETIC = ["A:", "A:-", "A:23", "=", "+", "-", ". ", "7+12=19", "99999999999999999999", "\n"]
LATEX = [
    r"\frac{",
    "}",
    "{",
    "^",
    "_",
    "x",
    "X",
    "=",
    r"\sqrt",
    r"\left(",
    r"\right)",
    r"\begin{matrix}",
    "&",
    r"\\",
    "$",
    r"\alpha",
    "10^{10^{10}}",
    "(x+1)^{100000}",
    "9" * 50,
]
HTML = [
    "<table>",
    "</table>",
    "<tr>",
    "</tr>",
    "<td>",
    "</td>",
    '<td colspan="99999999999">',
    '<td rowspan="-1">',
    "<th>",
    "<thead>",
    "<tbody>",
    "<b>",
    "<table><tr><td>",
    "<!--",
    "<?xml version='1.0' encoding='utf-8'?>",
    "&#0;",
    "<",
    ">",
]
BOXED = [r"\boxed{", "}", "{", r"\frac{1}{2}", "0.5", "1/2", "x", "=", "10^{10^{10}}", "\\"]

TIME_LIMIT_S = 2.0  # the table and formula time limits in these tests
COMPLETIONS = 3  # per example: a batch, kept small so the suite stays fast


def grids(max_side: int = 30) -> st.SearchStrategy[str]:
    """Large regular tables: the exact tree edit distance takes seconds on the big ones."""
    side = st.integers(1, max_side)
    return st.tuples(side, side).map(
        lambda rc: (
            "<table>"
            + "".join(
                "<tr>" + "".join(f"<td>{i * j}</td>" for j in range(rc[1])) + "</tr>"
                for i in range(rc[0])
            )
            + "</table>"
        )
    )


def batches(text: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.lists(text, min_size=1, max_size=COMPLETIONS)


@pytest.fixture(scope="module")
def docparse_rows():
    """A few real rows of each element type (reference markup, element type)."""
    rows = get_task("docparse", train_size=0, eval_size=30).rows("eval")
    return [(r["reference"], r["element_type"]) for r in rows]


@pytest.fixture(scope="module")
def docparse_rewards():
    """The registered docparse rewards with short time limits; workers started up front, so
    that the time bounds measure scoring, not process start-up."""
    rewards = {
        kind: docparse_reward_function(
            kind, formula_timeout_s=TIME_LIMIT_S, table_timeout_s=TIME_LIMIT_S
        )
        for kind in ("auto", "text", "table", "formula")
    }
    big = "<table>" + "<tr><td>1</td></tr>" * 200 + "</table>"  # long: starts the table worker
    rewards["auto"](
        ["p", "p"], ["x+1", big], reference=["x+1", big], element_type=["formula", "table"]
    )
    return rewards


def bound(n: int) -> float:
    """Seconds `n` completions may take: each within its limits (two formula stages), plus
    slack for a loaded machine."""
    return n * 2 * TIME_LIMIT_S + 10.0


@REWARD_SETTINGS
@given(batches(hostile_text(ARITHMETIC)))
def test_arithmetic_format_reward_properties(completions):
    check_reward_function(arithmetic_format_reward, completions, {}, low=0.0, high=1.0, seconds=2.0)


@REWARD_SETTINGS
@given(batches(hostile_text(ARITHMETIC)))
def test_arithmetic_verifier_properties(completions):
    task = get_task("arithmetic", train_size=0, eval_size=4)
    row = task.rows("eval")[0]
    columns = {k: [v] * len(completions) for k, v in row.items()}
    check_reward_function(
        task_reward_function(task), completions, columns, low=0.0, high=1.0, seconds=2.0
    )


@pytest.fixture(scope="module")
def math_task(tmp_path_factory):
    path = tmp_path_factory.mktemp("math") / "math.jsonl"
    rows = [
        {"problem": "Half of one?", "answer": r"\frac{1}{2}"},
        {"problem": "2+2", "answer": "4"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return get_task("math", path=str(path), eval_fraction=0.5, timeout_seconds=1)


@REWARD_SETTINGS
@given(completions=batches(hostile_text(BOXED)), which=st.integers(0, 1))
def test_math_verifier_properties(math_task, completions, which):
    rows = [*math_task.rows("train"), *math_task.rows("eval")]
    row = rows[which % len(rows)]
    columns = {k: [v] * len(completions) for k, v in row.items()}
    # math-verify's own limit is 1 s per parse and per comparison (main thread).
    check_reward_function(
        task_reward_function(math_task),
        completions,
        columns,
        low=0.0,
        high=1.0,
        seconds=len(completions) * 3.0 + 5.0,
    )


def docparse_columns(rows, picks, kind):
    chosen = [r for r in rows if kind in ("auto", r[1])]
    picked = [chosen[i % len(chosen)] for i in picks]
    return {"reference": [r[0] for r in picked], "element_type": [r[1] for r in picked]}


@REWARD_SETTINGS
@given(
    completions=batches(st.one_of(hostile_text(HTML + LATEX), grids())),
    picks=st.lists(st.integers(0, 100), min_size=COMPLETIONS, max_size=COMPLETIONS),
)
def test_docparse_auto_reward_properties(docparse_rows, docparse_rewards, completions, picks):
    columns = docparse_columns(docparse_rows, picks[: len(completions)], "auto")
    check_reward_function(
        docparse_rewards["auto"],
        completions,
        columns,
        low=0.0,
        high=1.0,
        seconds=bound(len(completions)),
        allow_none=False,
    )


@REWARD_SETTINGS
@given(
    completions=batches(st.one_of(hostile_text(HTML), grids())),
    picks=st.lists(st.integers(0, 100), min_size=COMPLETIONS, max_size=COMPLETIONS),
)
def test_docparse_table_reward_properties(docparse_rows, docparse_rewards, completions, picks):
    columns = docparse_columns(docparse_rows, picks[: len(completions)], "table")
    check_reward_function(
        docparse_rewards["table"],
        completions,
        columns,
        low=0.0,
        high=1.0,
        seconds=bound(len(completions)),
        allow_none=False,
    )


@REWARD_SETTINGS
@given(
    completions=batches(hostile_text(LATEX)),
    picks=st.lists(st.integers(0, 100), min_size=COMPLETIONS, max_size=COMPLETIONS),
)
def test_docparse_formula_reward_properties(docparse_rows, docparse_rewards, completions, picks):
    columns = docparse_columns(docparse_rows, picks[: len(completions)], "formula")
    check_reward_function(
        docparse_rewards["formula"],
        completions,
        columns,
        low=0.0,
        high=1.0,
        seconds=bound(len(completions)),
        allow_none=False,
    )


@REWARD_SETTINGS
@given(
    completions=batches(st.one_of(st.text(max_size=300), hostile_text(HTML + LATEX))),
    picks=st.lists(st.integers(0, 100), min_size=COMPLETIONS, max_size=COMPLETIONS),
)
def test_docparse_text_reward_properties(docparse_rows, docparse_rewards, completions, picks):
    columns = docparse_columns(docparse_rows, picks[: len(completions)], "text")
    check_reward_function(
        docparse_rewards["text"],
        completions,
        columns,
        low=0.0,
        high=1.0,
        seconds=2.0,
        allow_none=False,
    )


@pytest.mark.slow
@REWARD_SETTINGS
@given(completions=batches(hostile_text(HTML + LATEX)), which=st.integers(0, 100))
def test_docparse_task_verifier_properties(docparse_rows, completions, which):
    """The task's `verify` (default limits) is the reward too: None only for blank output."""
    task = get_task("docparse", train_size=0, eval_size=30)
    row = task.rows("eval")[which % 30]
    columns = {k: [v] * len(completions) for k, v in row.items()}
    values = check_reward_function(
        task_reward_function(task), completions, columns, low=0.0, high=1.0, seconds=60.0
    )
    for completion, value in zip(completions, values, strict=True):
        assert (value is None) == (not completion.strip())
