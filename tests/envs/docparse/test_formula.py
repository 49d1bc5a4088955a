"""The formula reward: parse failures score 0, equivalent formulas >= 0.8 (exact values worked
by hand from R = 0.8 r_sem + 0.2 (1 - Lev/max len)), time limits, the judge, fuzzing."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policyopt.envs.docparse import formula as docparse_formula
from policyopt.envs.docparse.formula import formula_reward, normalise_latex


def test_equivalent_formulas_score_at_least_0_8_by_hand():
    # "\frac{a}{b}" (11 chars) -> "a/b": no '/' to keep, so 8 deletions + 1 substitution = 9.
    assert formula_reward(r"\frac{a}{b}", "a/b") == pytest.approx(0.8 + 0.2 * (1 - 9 / 11))
    r = formula_reward("x^2+2x+1", "(x+1)^2")
    assert 0.8 <= r < 1.0
    assert formula_reward(r"\sin^2 x + \cos^2 x", "1") >= 0.8
    assert formula_reward("x+1", "x+1") == 1.0
    assert formula_reward("$x + 1$", r"\(x+1\)") == 1.0  # delimiters and spaces normalised


def test_equations_compare_both_sides():
    # Swapped sides: sem 1; "y=x^2" vs "x^2=y": Lev 4 of 5 -> 0.8 + 0.2 * 0.2.
    assert formula_reward("y = x^2", "x^2 = y") == pytest.approx(0.8 + 0.2 * (1 - 4 / 5))
    # A constant multiple: 2y = 2x^2 is y = x^2 ("2y=2x^2" vs "y=x^2": 2 deletions of 7).
    assert formula_reward("2y=2x^2", "y=x^2") == pytest.approx(0.8 + 0.2 * (1 - 2 / 7))
    assert formula_reward("y=x^2", "y=x^3") < 0.8
    assert formula_reward("y=x^2", "x^2") < 0.8  # an equation is not an expression


def test_invalid_latex_scores_zero():
    assert formula_reward(r"\frac{1}{", "x") == 0.0
    assert formula_reward(r"\frac{1}{", r"\frac{1}{") == 0.0  # identical but unparseable
    assert formula_reward("", "") == 0.0
    assert formula_reward("}{", "x") == 0.0


def test_different_formulas_score_below_0_8_by_hand():
    # Parse fine, not equivalent: only 0.2 r_struct. "x^2" vs "x^3": 1 substitution of 3.
    assert formula_reward("x^2", "x^3") == pytest.approx(0.2 * (1 - 1 / 3))
    assert formula_reward("a+b", "a-b") == pytest.approx(0.2 * (1 - 1 / 3))
    assert formula_reward(r"\frac{a}{b}", r"\frac{b}{a}") < 0.8


@pytest.mark.slow
def test_a_hanging_simplification_is_cut_at_the_time_limit_and_the_worker_recovers():
    assert formula_reward("x", "x") == 1.0  # a live worker
    worker = docparse_formula._workers[0]
    start = time.monotonic()
    r = formula_reward("(x+1)^{100000}", "x^2", timeout_s=1.0)
    assert time.monotonic() - start < 30
    # Parsed, equivalence killed: r_sem = 0. Lev("(x+1)^{100000}", "x^2") = 12 of 14.
    assert r == pytest.approx(0.2 * (1 - 12 / 14))
    assert not worker.alive()
    assert formula_reward("x^2-1", "(x-1)(x+1)", timeout_s=5.0) >= 0.8  # a new worker
    assert docparse_formula._workers[0] is not worker


def test_in_process_mode_gives_the_same_values():
    for pred, ref in [(r"\frac{a}{b}", "a/b"), ("x^2", "x^3"), (r"\frac{1}{", "x"), ("y=x", "x=y")]:
        assert formula_reward(pred, ref, timeout_s=None) == formula_reward(pred, ref)


def test_judge_replaces_the_symbolic_check_but_not_the_parse_check():
    calls = []

    def judge(pred, ref):
        calls.append((pred, ref))
        return 0.5

    # "x^2" vs "x^3": 0.8 * 0.5 + 0.2 * (2/3).
    assert formula_reward("x^2", "x^3", judge=judge) == pytest.approx(0.4 + 0.2 * 2 / 3)
    assert calls == [("x^2", "x^3")]
    assert formula_reward(r"\frac{1}{", "x", judge=judge) == 0.0
    assert len(calls) == 1  # not asked about unparseable output
    assert formula_reward("x", "x", judge=lambda p, r: 7.0) == 1.0  # clipped to [0, 1]
    with pytest.raises(ValueError, match="judge returned nan"):
        formula_reward("x", "y", judge=lambda p, r: float("nan"))


def test_normalisation_and_bad_arguments():
    assert normalise_latex(r" $ \alpha x + \, 1 $ ") == r"\alpha x+1"
    assert normalise_latex(r"\[a \cdot b\]") == r"a\cdot b"
    with pytest.raises(TypeError, match="prediction"):
        formula_reward(None, "x")
    with pytest.raises(ValueError, match="timeout_s"):
        formula_reward("x", "x", timeout_s=0)


LATEXISH = st.lists(
    st.sampled_from(
        [
            r"\frac",
            "{",
            "}",
            "^",
            "_",
            "x",
            "y",
            "2",
            "+",
            "-",
            "=",
            r"\sqrt",
            "(",
            ")",
            r"\left",
            r"\right",
            " ",
            "\\",
            "$",
            r"\sin",
            r"\{",
            ",",
            "&",
            r"\begin{matrix}",
        ]
    ),
    max_size=14,
).map("".join)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.one_of(LATEXISH, st.text(max_size=30)), LATEXISH)
def test_fuzz_never_raises_and_stays_in_unit_interval(pred, ref):
    assert 0.0 <= formula_reward(pred, ref, timeout_s=3.0) <= 1.0


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_symbols_compare_case_sensitively(timeout_s):
    # `X` and `x` are different variables: not equivalent, so only 0.2 r_struct is left.
    # "X+1" vs "x+1": 1 substitution of 3.
    assert formula_reward("X+1", "x+1", timeout_s=timeout_s) == pytest.approx(0.2 * (1 - 1 / 3))
    # "Ax=b" vs "ax=b": an equation in A is not one in a (1 substitution of 4).
    assert formula_reward("Ax=b", "ax=b", timeout_s=timeout_s) == pytest.approx(0.2 * (1 - 1 / 4))
    # Case kept on both sides, equivalence still found: "1+X" vs "X+1" (Lev 2 of 3).
    assert formula_reward("1+X", "X+1", timeout_s=timeout_s) == pytest.approx(
        0.8 + 0.2 * (1 - 2 / 3)
    )
    assert formula_reward(r"\frac{N}{M}", r"\frac{N}{M}", timeout_s=timeout_s) == 1.0
