"""The text reward against hand-computed edit distances, and fuzzing."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policyopt.envs.docparse.text import text_reward


def test_hand_values():
    # kitten -> sitting: 2 substitutions + 1 insertion = 3, over max length 7.
    assert text_reward("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert text_reward("abc", "abc") == 1.0
    assert text_reward("", "") == 1.0  # nothing to transcribe, nothing transcribed
    assert text_reward("", "abc") == 0.0
    assert text_reward("abc", "xyz") == 0.0
    assert text_reward("Résumé", "Resume") == pytest.approx(1 - 2 / 6)  # characters, not bytes
    assert text_reward("a b", "ab") == pytest.approx(1 - 1 / 3)  # whitespace counts


def test_non_strings_are_rejected_with_a_clear_error():
    with pytest.raises(TypeError, match="must be str"):
        text_reward(None, "a")


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text())
def test_fuzz_unit_interval_symmetric_identity(a, b):
    r = text_reward(a, b)
    assert 0.0 <= r <= 1.0
    assert r == text_reward(b, a)
    assert text_reward(a, a) == 1.0
