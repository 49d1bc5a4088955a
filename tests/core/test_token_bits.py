"""Packed token sets: by hand, round trips, and xgrammar's own layout."""

import importlib.util

import pytest
import torch

from policyopt.core.token_bits import unpack_token_bits
from token_bits_for_tests import pack_token_bits


def test_pack_by_hand():
    allowed = torch.zeros(2, 40, dtype=torch.bool)
    allowed[0, [0, 3, 33]] = True  # word 0: 2^0 + 2^3 = 9; word 1: 2^(33-32) = 2
    allowed[1, 31] = True  # bit 31: the sign bit, -2^31
    allowed[1, 39] = True  # word 1: 2^7 = 128
    words = pack_token_bits(allowed)
    assert words.dtype == torch.int32 and words.shape == (2, 2)
    assert words.tolist() == [[9, 2], [-(2**31), 128]]


def test_round_trip_and_all_tokens():
    gen = torch.Generator().manual_seed(0)
    allowed = torch.rand(3, 5, 77, generator=gen) < 0.4
    words = pack_token_bits(allowed)
    assert words.shape == (3, 5, 3)
    assert torch.equal(unpack_token_bits(words, 77), allowed)
    # -1 is every token; a narrower vocab reads the first tokens only
    assert unpack_token_bits(torch.full((2, 3), -1, dtype=torch.int32), 70).all()
    assert torch.equal(unpack_token_bits(words, 40), allowed[..., :40])
    with pytest.raises(ValueError, match="3 words hold 96 tokens, not 97"):
        unpack_token_bits(words, 97)


@pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="xgrammar not installed")
def test_the_layout_is_xgrammars():
    import xgrammar

    allowed = torch.rand(2, 70, generator=torch.Generator().manual_seed(1)) < 0.5
    logits = torch.zeros(2, 70)
    xgrammar.apply_token_bitmask_inplace(logits, pack_token_bits(allowed))
    assert torch.equal(logits == 0, allowed)  # xgrammar sets the disallowed logits to -inf
