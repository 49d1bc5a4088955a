"""SFT's length buckets: the same loss and gradient as one padded batch, with less padding."""

from __future__ import annotations

import torch

from policyopt.models.loading import load_model
from policyopt.tasks.base import get_task
from policyopt.train.sft import Example, completion_batch, sft_backward, sft_examples


def _setup(n: int = 24):
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    task = get_task("arithmetic", levels=[1, 2, 3], terse_fraction=0.5)
    rows = task.rows("train")
    pairs = sft_examples(task, tok, [rows[i] for i in range(n)])
    return model, pairs


def _grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_buckets_give_the_one_batch_token_mean_loss_and_gradient() -> None:
    model, pairs = _setup()
    # The reference, computed independently: one padded batch, token mean over completions.
    from policyopt.models.logprobs import response_logprobs

    ids, mask, width, loss_mask = completion_batch(pairs, 0)
    logp = response_logprobs(model, ids, mask, width).logp
    ref_loss = -(logp * loss_mask).sum() / loss_mask.sum()
    ref_loss.backward()
    ref = _grads(model).clone()
    model.zero_grad(set_to_none=True)
    for buckets in (1, 3, 5):
        loss = sft_backward(model, pairs, 0, buckets=buckets)
        assert abs(loss - float(ref_loss.detach())) < 1e-5, buckets
        torch.testing.assert_close(_grads(model), ref, rtol=1e-4, atol=1e-6)
        model.zero_grad(set_to_none=True)


def test_buckets_cut_the_padded_tokens() -> None:
    _, pairs = _setup(64)

    def padded(chunks: list[list[Example]]) -> int:
        return sum(completion_batch(c, 0)[1].numel() for c in chunks)

    from policyopt.train.sft import length_buckets

    one = padded(length_buckets(pairs, 1))
    three = padded(length_buckets(pairs, 3))
    real = sum(len(ex.prompt) + len(ex.target) for ex in pairs)
    assert three < 0.8 * one  # the mix of worked and answer-only targets pads half the batch
    assert real <= three
    # Every example is in exactly one bucket.
    assert sorted(map(str, sum(length_buckets(pairs, 3), []))) == sorted(map(str, pairs))
