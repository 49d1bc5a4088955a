"""The Countdown task: the safe verifier on hand cases, the searcher's traces, levels, and
verdicts against reasoning-gym's scorer (skipped when it is not installed)."""

import random
import re
from collections import Counter
from fractions import Fraction

import pytest

from policyopt.tasks import TASKS, get_task
from policyopt.tasks.countdown import CountdownTask, answer_expression, draw_problem
from policyopt.tasks.countdown_expr import MalformedExpression, evaluate, score
from policyopt.tasks.countdown_search import moves, search

ROW = {"numbers": [4, 7, 9], "target": 19}


def small(**options):
    return CountdownTask(**{"train_size": 120, "eval_size": 30, **options})


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("A:(7*4)-9", 1.0),  # correct
        ("7*4=28|9,28\n 28-9=19!\nA:7*4-9", 1.0),  # precedence: * before -
        ("A: 9 - (4 - 7) * 4 ", 0.0),  # 4 used twice, 7... well formed, wrong numbers
        ("A:(7*4)-9+4", 0.0),  # 4 reused
        ("A:7*4-8", 0.0),  # a number not given (8), 9 left out
        ("A:7+4", 0.0),  # 9 left out
        ("A:(7+4)+9", 0.0),  # all numbers, wrong value (20)
        ("A:9/(7-7)*4", 0.0),  # division by zero (and 7 reused): well formed, 0
        ("A:none", 0.0),  # the search gave up
        ("A:(7*4-9", None),  # unclosed parenthesis
        ("A:7**4-9", None),  # no power operator
        ("A:__import__('os')", None),  # not an expression: never evaluated
        ("A:", None),
        ("7*4=28 no answer line", None),
    ],
)
def test_verifier_hand_cases(completion, expected):
    assert small().verify(completion, ROW) == expected


def test_last_answer_line_counts_and_division_is_exact():
    assert answer_expression("A:1+1\nA:(7*4)-9\nmore") == "(7*4)-9"
    assert evaluate("(3/2)*4").value == 6  # exact fractions, not integer division
    assert evaluate("7/2").value == Fraction(7, 2)
    assert evaluate("-9+4*7").value == 19 and evaluate("-9+4*7").numbers == (9, 4, 7)
    assert score("(3/2)*4", [2, 3, 4], 6) == 1.0
    with pytest.raises(ZeroDivisionError):
        evaluate("1/(2-2)")
    with pytest.raises(MalformedExpression, match="unexpected character"):
        evaluate("2.5+1")


OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
OPS["/"] = lambda a, b: a // b if a % b == 0 else None
LINE = re.compile(r"^( *)(\d+)([-+*/])(\d+)=(\d+)(\|[\d,]+|!)?$")


def check_trace(numbers, target, text):
    """Every line is a legal move from the state at its depth; the last line before the
    answer hits the target; the answer expression is correct."""
    *body, answer = text.split("\n")
    states = {0: sorted(numbers)}
    for line in body:
        m = LINE.match(line)
        assert m, line
        depth = len(m.group(1))
        a, op, b, c = int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5))
        assert OPS[op](a, b) == c and a >= b
        state = list(states[depth])
        state.remove(a)
        state.remove(b)
        after = sorted([*state, c])
        if m.group(6) and m.group(6).startswith("|"):
            assert sorted(int(x) for x in m.group(6)[1:].split(",")) == after
            states[depth + 1] = after
        else:
            assert len(after) == 1
    assert body[-1].endswith("!") and int(LINE.match(body[-1]).group(5)) == target
    assert score(answer_expression(text), numbers, target) == 1.0


@pytest.mark.parametrize("order", ["closest", "lexical", "random"])
def test_searcher_finds_solutions_and_traces_parse(order):
    rng = random.Random(1)
    for k in range(60):
        numbers, target = draw_problem(rng, 3 + k % 2, (1, 9), (1, 100))
        trace = search(numbers, target, order, seed=k, max_lines=10_000)
        assert trace.expression is not None, (numbers, target)
        check_trace(numbers, target, trace.text)


def test_search_backtracks_and_gives_up_cleanly():
    # 1,1,1 -> 7 is impossible: every move is tried, then A:none.
    trace = search([1, 1, 1], 7, "lexical")
    assert trace.expression is None and trace.text.endswith("A:none")
    # Each of the 3 pairs: 1+1 (then 2+1, 2-1, 2*1) and 1*1 (then 1+1, 1*1; 1-1 = 0 and
    # /1 are not moves): 3 * ((1 + 3) + (1 + 2)) = 21 lines.
    assert len(moves(((1, "1"), (1, "1"), (1, "1")), ("+", "-", "*", "/"))) == 6
    assert trace.lines == 21
    capped = search([1, 1, 1, 1], 99, "lexical", max_lines=5)
    assert capped.lines == 5 and capped.expression is None
    # The good order tries the move nearest the target first.
    assert search([4, 7, 9], 28, "closest").text.startswith("7*4=28")


def test_registered_levels_and_demonstrations():
    assert "countdown" in TASKS
    task = get_task("countdown", train_size=90, eval_size=30, levels=[1, 2, 3], seed=2)
    rows = task.rows("train")
    assert Counter(rows["level"]) == {1: 30, 2: 30, 3: 30}
    for row in rows:
        assert len(row["numbers"]) == (3 if row["level"] == 1 else 4)
        assert row["prompt"] == f"T:{row['target']} N:{','.join(map(str, row['numbers']))}"
        for text in (row["demo"], row["solution"]):
            assert len(text) <= task.max_trace_chars
            check_trace(row["numbers"], row["target"], text)
        assert len(row["solution"]) <= len(row["demo"])  # the expert trace is the shortest
        assert task.verify(row["demo"], row) == 1.0 == task.verify(row["solution"], row)
        if row["level"] == 3:
            assert search(row["numbers"], row["target"], "closest").lines >= task.hard_lines
    assert set(rows["demo_style"]) <= {"closest", "lexical", "random"}
    assert len(set(rows["demo_style"])) > 1  # the warm start mixes strategies


def test_splits_disjoint_deterministic_and_bad_options():
    a, b = small(seed=1), small(seed=1)
    assert a.rows("train").to_dict() == b.rows("train").to_dict()
    assert not set(a.rows("train")["prompt"]) & set(a.rows("eval")["prompt"])
    with pytest.raises(ValueError, match="levels"):
        CountdownTask(levels=[4])
    with pytest.raises(ValueError, match="demo_orders"):
        CountdownTask(demo_orders={"best": 1.0})
    with pytest.raises(ValueError, match="number_range"):
        CountdownTask(number_range=[0, 9])


def test_output_style_tells_the_first_move_apart():
    task = small()
    row = {"numbers": [4, 7, 9], "target": 28}
    assert task.output_style(search([4, 7, 9], 28, "closest").text, row) == "closest"
    assert task.output_style("9+7=16|4,16\n 16+4=20\nA:none", row) == "other"


def test_verdicts_agree_with_reasoning_gym():
    """Our verifier against reasoning-gym's Countdown scorer (1.0 = solved), on its own
    generated problems: its answers, our searcher's, and broken variants of both."""
    countdown = pytest.importorskip("reasoning_gym.games.countdown")
    config = countdown.CountdownConfig(
        min_numbers=3,
        max_numbers=4,
        min_value=1,
        max_value=12,
        min_target=1,
        max_target=100,
        seed=5,
        size=150,
    )
    data = countdown.CountdownDataset(config)
    checked = Counter()
    for entry in data:
        numbers, target = entry["metadata"]["numbers"], entry["metadata"]["target"]
        found = search(numbers, target, "closest", max_lines=5000).expression
        candidates = [entry["answer"], *([found] if found else [])]
        for text in list(candidates):
            candidates.append(text.replace("+", "-", 1))  # another value
            candidates.append(re.sub(r"\d+", "5", text, count=1))  # another number
            candidates.append(f"({text})*1")  # a number not given
            digits = re.findall(r"\d+", text)
            candidates.append(text.replace(digits[-1], digits[0], 1))  # a number reused
        for text in candidates:
            ours = score(text, numbers, target) == 1.0
            theirs = data.score_answer(text, entry) == 1.0
            assert ours == theirs, (text, numbers, target)
            checked[ours] += 1
    assert checked[True] >= 150 and checked[False] >= 300


def test_max_value_caps_every_move_and_the_search_still_solves():
    task = small(levels=[1, 2, 3], number_range=[1, 6], target_range=[1, 24], max_value=24,
                 hard_lines=8)  # fmt: skip
    for row in task.rows("train"):
        for text in (row["demo"], row["solution"]):
            values = [int(m.group(5)) for m in map(LINE.match, text.split("\n")[:-1])]
            assert max(values) <= 24
        assert task.verify(row["demo"], row) == 1.0
    with pytest.raises(ValueError, match="max_value"):
        CountdownTask(target_range=[1, 50], max_value=30)
