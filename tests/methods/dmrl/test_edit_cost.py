from __future__ import annotations

import pytest
import torch
from rapidfuzz.distance import Levenshtein

from policyopt.methods.dmrl import EditCost, token_edit_distance
from policyopt.methods.dmrl.edit_cost import levenshtein

CASES = [
    ("", ""),
    ("", "keep ad load low"),
    ("keep ad load low", ""),
    ("keep ad load low", "keep ad load high"),
    ("set quality weight high", "raise the quality weight very high now"),
    ("a b c d", "d c b a"),
]


@pytest.mark.parametrize("old,new", CASES)
def test_token_edit_distance_matches_rapidfuzz(old, new):
    a, b = old.split(), new.split()
    expected = Levenshtein.distance(a, b) / max(len(a), len(b)) if (a or b) else 0.0
    assert token_edit_distance(old, new) == pytest.approx(expected)


def test_token_edit_distance_by_hand():
    assert token_edit_distance("keep ad load low", "keep ad load high") == 0.25
    assert token_edit_distance("", "") == 0.0
    assert token_edit_distance("x", "") == 1.0
    assert levenshtein(list("kitten"), list("sitting")) == 3


def fake_embedder(texts):
    # unit vectors chosen by hand: "a" -> e1, "b" -> (e1 + e2)/√2, anything else -> e2
    table = {"a": [1.0, 0.0], "b": [2**-0.5, 2**-0.5]}
    return torch.tensor([table.get(t, [0.0, 1.0]) for t in texts])


def test_edit_cost_formula_with_weights():
    cost = EditCost({"ads": {"delete": 2.0}}, eta=0.25, embedder=fake_embedder)
    got = cost(
        ["ads", "ads", "pacing"], ["delete", "replace", "insert"], ["a", "a", "a"], ["b", "a", "z"]
    )
    cos_ab = 2**-0.5
    expected = [
        2.0 * (0.25 * 1.0 + 0.75 * (1 - cos_ab)),
        1.0 * 0.0,
        1.0 * (0.25 * 1.0 + 0.75 * 1.0),
    ]
    torch.testing.assert_close(got, torch.tensor(expected))


def test_bad_weights_are_named():
    with pytest.raises(ValueError, match=r"\['ads'\]\['move'\]"):
        EditCost({"ads": {"move": 1.0}})
    with pytest.raises(ValueError, match="eta"):
        EditCost(eta=1.5)


def test_edit_cost_with_minilm_is_small_for_a_near_copy():
    cost = EditCost(eta=0.5)
    c = cost(
        ["ads"] * 2,
        ["replace"] * 2,
        ["keep ad load low", "keep ad load low"],
        ["keep ad load low", "explore new advertisers often"],
    )
    assert c[0] == pytest.approx(0.0, abs=1e-5)
    assert 0.5 < c[1] <= 1.0
