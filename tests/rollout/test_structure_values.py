"""Declared structure in Rollouts: select and concat of [N], [N, R] and pairwise [N, N] values."""

import pytest
import torch

from policyopt.rollout.base import Rollouts, concat_rollouts


def rollouts(n: int, width: int, **structure: torch.Tensor) -> Rollouts:
    return Rollouts(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        response_ids=torch.ones(n, width, dtype=torch.long),
        response_mask=torch.ones(n, width),
        logp=torch.zeros(n, width),
        entropies=torch.zeros(n, width),
        truncated=torch.zeros(n, dtype=torch.bool),
        generated_tokens=n * width,
    )


def with_structure(n: int, width: int, start: int) -> Rollouts:
    """R = N = 3 for the first part, so that shape alone cannot tell [N, R] from [N, N]."""
    r = rollouts(n, width).with_structure(
        {
            "per_rollout": torch.arange(start, start + n).float(),
            "per_token": torch.arange(n * width).reshape(n, width) + 100 * start,
        }
    )
    pair = torch.arange(n * n).reshape(n, n).float() + 10 * start
    return r.with_structure({"pair": pair}, pairwise=True)


def test_select_indexes_pairwise_structure_in_both_dims():
    r = with_structure(3, 3, start=0)
    assert r.pairwise == {"pair"}
    for index in (torch.tensor([2, 0]), torch.tensor([True, False, True])):
        s = r.select(index)
        rows = [2, 0] if index.dtype == torch.long else [0, 2]
        assert s.structure["per_rollout"].tolist() == [float(i) for i in rows]
        assert s.structure["per_token"].tolist() == [[3 * i, 3 * i + 1, 3 * i + 2] for i in rows]
        assert s.structure["pair"].tolist() == [[3.0 * i + j for j in rows] for i in rows]
        assert s.pairwise == {"pair"}


def test_concat_pads_per_token_and_puts_pairwise_on_the_block_diagonal():
    a, b = with_structure(3, 3, start=0), with_structure(2, 4, start=1)
    c = concat_rollouts([a, b], pad_id=0)
    assert c.structure["per_rollout"].tolist() == [0, 1, 2, 1, 2]
    assert c.structure["per_token"].tolist() == [
        [0, 1, 2, 0],
        [3, 4, 5, 0],
        [6, 7, 8, 0],
        [100, 101, 102, 103],
        [104, 105, 106, 107],
    ]
    assert c.structure["pair"].tolist() == [
        [0, 1, 2, 0, 0],
        [3, 4, 5, 0, 0],
        [6, 7, 8, 0, 0],
        [0, 0, 0, 10, 11],
        [0, 0, 0, 12, 13],
    ]
    assert c.pairwise == {"pair"}
    # select after concat: both dims of the pairwise value follow the rows.
    assert c.select(torch.tensor([4, 0])).structure["pair"].tolist() == [[13, 0], [0, 0]]


def test_concat_of_different_structure_is_an_error_not_a_silent_drop():
    a, b = with_structure(3, 3, start=0), rollouts(2, 4)
    with pytest.raises(ValueError, match="different structure"):
        concat_rollouts([a, b], pad_id=0)
    with pytest.raises(ValueError, match=r"must be \[N, N\]"):
        rollouts(2, 2).with_structure({"x": torch.zeros(2, 3)}, pairwise=True)


def test_adding_structure_leaves_every_earlier_copy_as_it_was():
    """Structure added to a batch is on the new batch only: a copy made before (the sampled
    batch a metric reads, a kept selection) does not change under it."""
    from dataclasses import replace

    from policyopt.train.batch import Batch

    before = Batch(
        rollouts=rollouts(2, 3),
        group_ids=torch.tensor([0, 0]),
        prompts=["p", "p"],
        completions=["a", "b"],
        columns={},
    )
    copy = replace(before, completions=["a", "c"])
    after = copy.with_structure({"x": torch.ones(2)})
    assert "x" in after.structure
    assert "x" not in copy.structure and "x" not in before.structure
    assert "x" not in before.rollouts.structure
