"""pass@k, avg@k, maj@k by hand and against math.comb."""

import math

import pytest

from policyopt.core import avg_at_k, maj_at_k, pass_at_k, pass_at_k_curve


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 − C(3,2)/C(5,2) = 1 − 3/10
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 − C(7,5)/C(10,5)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 = c/n
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0  # n − c = 3 < k: every 4-subset has the correct one


def test_pass_at_k_matches_closed_form():
    for n in range(1, 25):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    # C(1000, 100) overflows a float; the product form does not.
    exact = 1 - math.comb(997, 100) / math.comb(1000, 100)  # exact rational, then float
    assert pass_at_k(1000, 3, 100) == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_curve():
    assert pass_at_k_curve(5, 2, [1, 2, 5]) == pytest.approx([0.4, 0.7, 1.0])


def test_pass_at_k_errors():
    with pytest.raises(ValueError, match="k=6 exceeds the number of samples n=5"):
        pass_at_k(5, 1, 6)
    with pytest.raises(ValueError, match="c=6 must be between 0 and n=5"):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError, match="k must be at least 1"):
        pass_at_k(5, 1, 0)
    with pytest.raises(TypeError, match="c must be an int"):
        pass_at_k(5, 1.5, 1)


def test_avg_at_k():
    assert avg_at_k([1, 0, 1, 1]) == 0.75
    assert avg_at_k([True, False]) == 0.5
    assert avg_at_k([0.2, 0.4]) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="at least one sample"):
        avg_at_k([])


def test_maj_at_k():
    # "4" has 2 votes vs 1 for "5"; the unparseable sample does not vote
    assert maj_at_k(["4", "5", "4", None], [True, False, True, False]) == 1.0
    # tie 2–2 goes to the first seen answer, "5", which is wrong
    assert maj_at_k(["5", "4", "4", "5"], [False, True, True, False]) == 0.0
    # three None do not outvote one parseable answer
    assert maj_at_k([None, None, None, "3"], [False, False, False, True]) == 1.0
    assert maj_at_k([None, None], [False, False]) == 0.0
    with pytest.raises(ValueError, match="2 answers but 1 correctness flags"):
        maj_at_k(["1", "2"], [True])
