"""Micro-batches by length: rows longest first, the loss and gradient of any split, and the
padded fraction of what the update's forwards computed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import policyopt.train.update as update_module
from policyopt.train.distributed import Dist, MicroBatches, Padding
from policyopt.train.trainer import Trainer
from policyopt.train.update import minibatch_step, update
from run_configs import finished_batch

# Response lengths given to the batch's 8 rows: a mix of short and long, unsorted.
LENGTHS = [12, 2, 9, 3, 12, 1, 7, 4]


def test_rows_go_longest_first_when_they_make_several_micro_batches() -> None:
    lengths = torch.tensor([1, 5, 3, 5, 2])
    split = MicroBatches(Dist(), torch.arange(5), 2, lengths=lengths)
    assert [rows.tolist() for rows in split] == [[1, 3], [2, 4], [0]]  # ties keep their order
    some = MicroBatches(Dist(), torch.tensor([4, 0, 2]), 2, lengths=lengths)
    assert [rows.tolist() for rows in some] == [[2, 4], [0]]
    whole = MicroBatches(Dist(), torch.arange(5), 8, lengths=lengths)
    assert [rows.tolist() for rows in whole] == [[0, 1, 2, 3, 4]]  # one pass: as given


def test_padding_counts_positions_of_own_passes() -> None:
    padding = Padding()
    passes = MicroBatches(Dist(), torch.arange(3), 2, padding=padding)
    for _ in passes:
        passes.computed(torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert (padding.positions, padding.padded) == (12, 4)
    assert padding.fraction(Dist()) == pytest.approx(4 / 12)


@pytest.fixture
def trainer(tmp_path, small_config):
    trainer = Trainer(small_config(tmp_path, "rollout.prompts_per_step=2"))
    yield trainer
    trainer.close()


def varied_batch(trainer: Trainer):
    """A finished batch of 8 rows whose responses are cut to LENGTHS, with advantages of
    both signs (so that the loss and its gradient are not 0)."""
    batch = finished_batch(trainer, [0, 1])
    r = batch.rollouts
    keep = torch.arange(r.response_ids.shape[1])[None, :] < torch.tensor(LENGTHS)[:, None]
    mask = r.response_mask * keep
    rollouts = replace(r, response_mask=mask, logp=r.logp * mask, entropies=r.entropies * mask)
    advantages = torch.randn(8, generator=torch.Generator().manual_seed(0))
    return replace(batch, rollouts=rollouts, loss_mask=mask, advantages=advantages)


def loss_and_grad(trainer: Trainer, batch, size: int) -> tuple[float, torch.Tensor]:
    opt = replace(trainer.optimization, micro_batch_size=size)
    metrics, _ = minibatch_step(
        trainer.parts.loss, batch, torch.arange(len(batch)), opt, None, None
    )
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    grad = torch.cat([p.grad.flatten() for p in params])
    trainer.optimizer.zero_grad(set_to_none=True)
    return metrics["loss"], grad


def test_the_length_order_gives_the_loss_and_gradient_of_any_split(trainer, monkeypatch) -> None:
    batch = varied_batch(trainer)
    assert set(batch.rollouts.lengths.tolist()) == set(LENGTHS)
    whole = loss_and_grad(trainer, batch, 8)
    by_length = loss_and_grad(trainer, batch, 3)
    # Equal lengths: the stable order is the batch's own, the split as it was before.
    monkeypatch.setattr(update_module, "row_lengths", lambda r: torch.zeros(len(r)))
    as_given = loss_and_grad(trainer, batch, 3)
    assert abs(whole[0]) > 0.1 and whole[1].norm() > 0.1
    for loss, grad in (by_length, as_given):
        assert loss == pytest.approx(whole[0], rel=1e-5)
        assert torch.allclose(grad, whole[1], rtol=1e-4, atol=1e-7)


def padded_fraction_by_hand(prompt_lens: list[int], order: list[int], size: int) -> float:
    """Each micro-batch padded to its longest prompt and longest response."""
    positions = padded = 0
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        width = max(prompt_lens[i] for i in rows) + max(LENGTHS[i] for i in rows)
        positions += len(rows) * width
        padded += len(rows) * width - sum(prompt_lens[i] + LENGTHS[i] for i in rows)
    return padded / positions


def test_padded_fraction_is_what_each_micro_batch_pads(trainer) -> None:
    batch = varied_batch(trainer)
    prompt_lens = batch.rollouts.prompt_mask.sum(-1).tolist()
    trainer.optimization.micro_batch_size = 3
    metrics = update(trainer.parts.loss, batch, trainer.optimization)
    longest_first = sorted(range(8), key=lambda i: (-LENGTHS[i], -prompt_lens[i]))
    want = padded_fraction_by_hand(prompt_lens, longest_first, 3)
    assert metrics["padded_fraction"] == pytest.approx(want)
    assert want < padded_fraction_by_hand(prompt_lens, list(range(8)), 3)  # than unsorted
    trainer.optimization.micro_batch_size = 64  # one micro-batch, as given: the batch's padding
    whole = update(trainer.parts.loss, batch, trainer.optimization)
    assert whole["padded_fraction"] == pytest.approx(
        padded_fraction_by_hand(prompt_lens, list(range(8)), 8)
    )
