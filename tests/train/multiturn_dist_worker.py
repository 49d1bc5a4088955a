"""dist_worker.py's update on a multi-turn global batch: responses of more than 4 tokens
hold 2 environment tokens (response and loss mask 0, read by the policy) after their
second token. Run alone: the single-process reference; under torchrun: DDP."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import dist_worker

single_turn_batch = dist_worker.global_batch


def global_batch():  # noqa: ANN201 - dist_worker's Batch
    batch = single_turn_batch()
    r = batch.rollouts
    mask = r.response_mask.clone()
    mask[r.lengths > 4, 2:4] = 0.0
    assert batch.loss_mask is not None
    return replace(batch, rollouts=replace(r, response_mask=mask), loss_mask=batch.loss_mask * mask)


dist_worker.global_batch = global_batch

if __name__ == "__main__":
    dist_worker.main(Path(sys.argv[1]))
