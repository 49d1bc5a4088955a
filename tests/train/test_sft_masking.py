"""SFT on demonstrations with environment text: the environment's tokens are read, never
trained on, and plain-string demonstrations train exactly as before."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from policyopt.models.loading import load_model, load_tokenizer
from policyopt.models.logprobs import response_logprobs
from policyopt.tasks.base import Task, get_task
from policyopt.train.sft import (
    Example,
    completion_batch,
    demonstration_ids,
    sft_backward,
    sft_examples,
)
from sft_keys_for_tests import earlier_sft_cache_key


def _grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _hand_examples(tok) -> list[Example]:  # noqa: ANN001
    """Two demonstrations, each: a model turn, a reply (environment), a model turn, EOS."""
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    out = []
    for prompt, segments in [
        ("Q:47*36=?\n", [("calc(47*36)</s>", True), ("=1692\n", False), ("A:1692", True)]),
        ("Q:5*3=?\n", [("calc(5*3)</s>", True), ("=15\n", False), ("A:15", True)]),
    ]:
        target, trained = demonstration_ids(tok, segments)
        out.append(Example(ids(prompt), target, trained))
    return out


def test_demonstration_ids_tokenize_each_segment_and_mark_the_environment_s() -> None:
    tok = load_tokenizer("tiny")
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    segments = [("calc(47*36)</s>", True), ("=1692\n", False), ("A:1692", True)]
    target, trained = demonstration_ids(tok, segments)
    # The character tokenizer: the segments' ids are the whole text's.
    assert target == ids("calc(47*36)</s>=1692\nA:1692") + [tok.eos_token_id]
    n_call, n_reply = len(ids("calc(47*36)</s>")), len(ids("=1692\n"))
    assert trained == [1] * n_call + [0] * n_reply + [1] * (len(ids("A:1692")) + 1)
    assert ids("calc(47*36)</s>")[-1] == tok.eos_token_id  # the turn's end is the EOS id


def test_masked_loss_is_the_cross_entropy_of_the_model_s_tokens_only() -> None:
    """Hand-worked: the loss and gradient are F.cross_entropy's mean over the positions that
    predict a trained token, computed from a plain forward of each sequence."""
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    examples = _hand_examples(tok)
    # The reference: one unpadded forward per sequence; the label of a position is the next
    # token, or -100 (ignored) where that token is the prompt's or the environment's.
    logits, labels = [], []
    for ex in examples:
        seq = torch.tensor([ex.prompt + ex.target])
        logits.append(model(seq).logits[0, :-1])
        label = [-100] * (len(ex.prompt) - 1)
        label += [t if keep else -100 for t, keep in zip(ex.target, ex.trained, strict=True)]
        labels.append(torch.tensor(label))
    ref_loss = F.cross_entropy(torch.cat(logits), torch.cat(labels), ignore_index=-100)
    n_trained = sum(sum(ex.trained) for ex in examples)
    assert (
        int((torch.cat(labels) != -100).sum()) == n_trained < sum(len(ex.target) for ex in examples)
    )
    ref_loss.backward()
    ref = _grads(model).clone()
    model.zero_grad(set_to_none=True)
    for buckets in (1, 2):
        loss = sft_backward(model, examples, tok.pad_token_id, buckets=buckets)
        assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-5)
        torch.testing.assert_close(_grads(model), ref, rtol=1e-4, atol=1e-6)
        model.zero_grad(set_to_none=True)


def test_the_environment_s_tokens_stay_in_the_attention() -> None:
    tok = load_tokenizer("tiny")
    examples = _hand_examples(tok)
    ids, attention, width, loss_mask = completion_batch(examples, tok.pad_token_id)
    for i, ex in enumerate(examples):
        n = len(ex.target)
        assert attention[i, -width:][:n].tolist() == [1] * n  # every completion token is read
        assert loss_mask[i, :n].tolist() == [float(t) for t in ex.trained]
        assert ids[i, -width:][:n].tolist() == ex.target


def test_the_reply_s_target_tokens_change_nothing_in_the_loss() -> None:
    """A reply at the end of a completion (nothing after it reads it): whatever its tokens,
    the loss and the gradient are the same."""
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt, turn = ids("Q:47*36=?\n"), ids("calc(47*36)")
    results = []
    for reply in ("=1692\n", "=9999\n", "error: x"):
        r = ids(reply)
        example = Example(prompt, turn + r, [1] * len(turn) + [0] * len(r))
        loss = sft_backward(model, [example], tok.pad_token_id)
        results.append((loss, _grads(model).clone()))
        model.zero_grad(set_to_none=True)
    for loss, grad in results[1:]:
        assert loss == results[0][0]
        torch.testing.assert_close(grad, results[0][1], rtol=0, atol=1e-7)


def _old_sft_backward(model, pairs, pad_id):  # noqa: ANN001, ANN202
    """SFT's loss before environment spans, copied (one bucket: the batch sorted by
    length): -sum(log p) / completion tokens."""
    count = sum(len(c) for _, c in pairs)
    from policyopt.rollout.hf_engine import left_pad

    pairs = sorted(pairs, key=lambda pc: len(pc[0]) + len(pc[1]))
    prompt_ids, prompt_mask = left_pad([p for p, _ in pairs], pad_id)
    width = max(len(c) for _, c in pairs)
    comp = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    cmask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (_, c) in enumerate(pairs):
        comp[i, : len(c)] = torch.tensor(c)
        cmask[i, : len(c)] = 1
    ids, mask = torch.cat([prompt_ids, comp], 1), torch.cat([prompt_mask, cmask], 1)
    logp = response_logprobs(model, ids, mask, width).logp
    loss = -(logp * cmask.float()).sum() / count
    loss.backward()
    return float(loss.detach())


def test_plain_string_demonstrations_train_bit_for_bit_as_before() -> None:
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    task = get_task("arithmetic", levels=[1, 2, 3], terse_fraction=0.5)
    rows = [task.rows("train")[i] for i in range(12)]
    examples = sft_examples(task, tok, rows)
    old_targets = [
        tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for row in rows
        for s in task.sft_targets(row)
    ]
    assert [ex.target for ex in examples] == old_targets
    assert all(ex.trained == [1] * len(ex.target) for ex in examples)
    old = _old_sft_backward(model, [(ex.prompt, ex.target) for ex in examples], tok.pad_token_id)
    old_grads = _grads(model).clone()
    model.zero_grad(set_to_none=True)
    new = sft_backward(model, examples, tok.pad_token_id)
    assert new == old
    assert torch.equal(_grads(model), old_grads)
    # (prompt, completion) pairs, as callers outside SFT build them, train every token.
    model.zero_grad(set_to_none=True)
    assert sft_backward(model, [(ex.prompt, ex.target) for ex in examples], tok.pad_token_id) == old
    assert torch.equal(_grads(model), old_grads)


def test_a_task_s_default_segments_are_its_targets_whole() -> None:
    task = get_task("arithmetic", levels=[1], train_size=4, eval_size=2)
    row = task.rows("train")[0]
    assert task.sft_segments(row) == [[(t, True)] for t in task.sft_targets(row)]
    assert type(task).sft_segments is Task.sft_segments


# ------------------------------------------------------------------- the SFT cache key
def _key_without_masking(config) -> str:  # noqa: ANN001
    """sft_cache_key as it was before SFT masked environment text."""
    return earlier_sft_cache_key(config, segments=False)


def test_the_cache_key_changes_for_the_tool_recipe_only() -> None:
    from policyopt.pipelines.quickstart import sft_cache_key
    from policyopt.recipes import recipe_config, recipe_names

    for name in recipe_names():
        config = recipe_config(name, [], None, None)
        if name == "tools":
            assert sft_cache_key(config) != _key_without_masking(config)
        else:  # earlier warm starts of every other recipe stay valid
            assert sft_cache_key(config) == _key_without_masking(config), name
