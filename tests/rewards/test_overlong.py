"""DAPO overlong shaping at its boundaries, worked by hand."""

import pytest
import torch

from policyopt.rewards import overlong_penalty


def test_boundaries_by_hand():
    # L_max = 20, L_cache = 4: no penalty up to 16, ramp over 17..20, -1 beyond 20
    lengths = torch.tensor([0, 15, 16, 17, 18, 19, 20, 21, 100])
    expected = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
    out = overlong_penalty(lengths, max_len=20, cache_len=4)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out, expected)


def test_keeps_shape_and_takes_float_lengths():
    lengths = torch.tensor([[10.0, 13.0], [14.0, 12.0]])
    out = overlong_penalty(lengths, max_len=14, cache_len=4)  # threshold 10
    torch.testing.assert_close(out, torch.tensor([[0.0, -0.75], [-1.0, -0.5]]))


def test_zero_buffer_is_a_hard_cut_and_full_buffer_ramps_from_zero():
    lengths = torch.tensor([0, 9, 10, 11])
    torch.testing.assert_close(
        overlong_penalty(lengths, 10, 0), torch.tensor([0.0, 0.0, 0.0, -1.0])
    )
    torch.testing.assert_close(
        overlong_penalty(lengths, 10, 10), torch.tensor([0.0, -0.9, -1.0, -1.0])
    )


@pytest.mark.parametrize(("max_len", "cache_len"), [(0, 0), (10, -1), (10, 11)])
def test_bad_arguments(max_len, cache_len):
    with pytest.raises(ValueError, match="overlong_penalty"):
        overlong_penalty(torch.tensor([1]), max_len, cache_len)
