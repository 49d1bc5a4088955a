"""The shared option checks: each names the task, the option and the value it got."""

import pytest

from policyopt.tasks.options import fraction, int_pair, sizes, split_name, subset


def test_int_pair():
    assert int_pair("t", "r", [2, 9]) == (2, 9)
    assert int_pair("t", "r", [3, 3], low=1) == (3, 3)
    with pytest.raises(ValueError, match=r"t task: r must be two integers \[lo, hi\], got \[1\]"):
        int_pair("t", "r", [1])
    with pytest.raises(ValueError, match=r"t task: r must satisfy 1 <= lo <= hi, got \[0, 4\]"):
        int_pair("t", "r", [0, 4], low=1)
    with pytest.raises(ValueError, match="two integers"):
        int_pair("t", "r", [1.5, 4])


def test_subset_sizes_fraction_split():
    assert subset("t", "levels", [1, 3], (1, 2, 3)) == [1, 3]
    with pytest.raises(ValueError, match=r"t task: levels must be a non-empty subset of \[1, 2\]"):
        subset("t", "levels", [], (1, 2))
    with pytest.raises(ValueError, match="got \\[4\\]"):
        subset("t", "levels", [4], {1: 3, 2: 4})
    sizes("t", 0, 10)
    with pytest.raises(ValueError, match="train_size=-1, eval_size=10"):
        sizes("t", -1, 10)
    assert fraction("t", "f", 1) == 1.0
    with pytest.raises(ValueError, match=r"t task: f must be in \[0, 1\], got 1.5"):
        fraction("t", "f", 1.5)
    split_name("t", "eval")
    with pytest.raises(ValueError, match="t task: unknown split 'test'"):
        split_name("t", "test")
