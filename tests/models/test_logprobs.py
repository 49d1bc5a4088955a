"""Chunked response log-probs against the full-logits computation and hand-worked numbers."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from policyopt.models.logprobs import (
    chunked_head_logprobs,
    naive_head_logprobs,
    naive_response_logprobs,
    position_ids_from_mask,
    response_logprobs,
)
from policyopt.models.tiny import build_tiny_model

SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
R = 5  # response width


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path_factory.mktemp("logprobs"), seed=1, **SMALL)
    return AutoModelForCausalLM.from_pretrained(path)


def batch() -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Prompts of 4, 7 and 2 real tokens left-padded to P = 7; responses of 5, 3, 4 tokens
    right-padded to R = 5. Returns ids, mask, prompt lengths and response lengths."""
    gen = torch.Generator().manual_seed(0)
    prompt_lens, response_lens = [4, 7, 2], [5, 3, 4]
    ids = torch.zeros(3, 7 + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        ids[b, 7 - p : 7 + r] = torch.randint(4, 101, (p + r,), generator=gen)
        mask[b, 7 - p : 7 + r] = 1
    return ids, mask, prompt_lens, response_lens


def test_position_ids_skip_left_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_naive(model, temperature: float) -> None:
    ids, mask, _, _ = batch()
    kwargs = {"temperature": temperature, "with_entropy": True, "with_hidden": True}
    got = response_logprobs(model, ids, mask, R, chunk_size=4, **kwargs)  # 4 < B * R = 15
    ref = naive_response_logprobs(model, ids, mask, R, **kwargs)
    assert got.logp.shape == got.entropies.shape == (3, R)
    assert got.hidden.shape == (3, R, 32)
    torch.testing.assert_close(got.logp, ref.logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropies, ref.entropies, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.hidden, ref.hidden, atol=1e-5, rtol=0)
    assert got.entropies.requires_grad is False


def test_padded_rows_equal_unpadded_rows_run_alone(model) -> None:
    """Independent of the position-id logic: each row alone, no padding, plain log_softmax."""
    ids, mask, prompt_lens, response_lens = batch()
    got = response_logprobs(model, ids, mask, R, temperature=0.7, chunk_size=3, with_entropy=True)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        row = ids[b, 7 - p : 7 + r][None]
        with torch.no_grad():
            z = model(row).logits[0, p - 1 : p + r - 1] / 0.7  # outputs predicting the response
        probs = torch.softmax(z, -1)
        logp = torch.log(probs.gather(-1, row[0, p:, None]).squeeze(-1))
        entropy = -(probs * torch.log(probs)).sum(-1)
        torch.testing.assert_close(got.logp[b, :r], logp, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.entropies[b, :r], entropy, atol=1e-5, rtol=0)


def test_gradients_equal_naive(model) -> None:
    ids, mask, _, _ = batch()
    weights = torch.randn(3, R, generator=torch.Generator().manual_seed(1))
    grads = []
    for fn, kw in ((response_logprobs, {"chunk_size": 4}), (naive_response_logprobs, {})):
        model.zero_grad()
        (fn(model, ids, mask, R, temperature=0.7, **kw).logp * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    model.zero_grad()
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert g.abs().sum() > 0 or "embed_tokens" in name, name  # trunk and head get gradient
        torch.testing.assert_close(g, grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_bfloat16_model(model) -> None:
    """bf16 weights: logits are upcast to float32 per chunk; gradients reach bf16 params."""
    ids, mask, _, _ = batch()
    half = copy.deepcopy(model).to(torch.bfloat16)
    got = response_logprobs(half, ids, mask, R, chunk_size=4, with_entropy=True)
    ref = naive_response_logprobs(half, ids, mask, R, with_entropy=True)
    assert got.logp.dtype == torch.float32
    torch.testing.assert_close(got.logp, ref.logp, atol=1e-3, rtol=0)
    torch.testing.assert_close(got.entropies, ref.entropies, atol=1e-3, rtol=0)
    got.logp.sum().backward()
    assert half.lm_head.weight.grad.dtype == torch.bfloat16
    assert half.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0


def test_head_logprobs_by_hand() -> None:
    """Logits (0, ln 2, ln 3): p = (1/6, 1/3, 1/2)."""
    head = torch.nn.Linear(1, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0], [math.log(2)], [math.log(3)]]))
    hidden, targets = torch.ones(2, 1), torch.tensor([2, 0])
    logp, entropy = chunked_head_logprobs(hidden, targets, head, chunk_size=1, with_entropy=True)
    torch.testing.assert_close(logp, torch.tensor([math.log(1 / 2), math.log(1 / 6)]))
    h = math.log(6) / 6 + math.log(3) / 3 + math.log(2) / 2  # -sum p ln p = 1.0114
    torch.testing.assert_close(entropy, torch.tensor([h, h]))
    # temperature 2 on logits (0, ln 4, ln 9) gives the same distribution again
    with torch.no_grad():
        head.weight.mul_(2)
    logp2, _ = chunked_head_logprobs(hidden, targets, head, temperature=2.0, chunk_size=2)
    torch.testing.assert_close(logp2, logp)


def _heads(hidden: int, vocab: int) -> list[torch.nn.Module]:
    """A plain Linear (custom autograd path) and a wrapped one (checkpoint path)."""
    linear = torch.nn.Linear(hidden, vocab)
    return [linear, torch.nn.Sequential(linear)]


@pytest.mark.parametrize("path", ["linear", "module"])
def test_head_bias_and_gradients_match_naive(path: str) -> None:
    torch.manual_seed(0)
    linear, wrapped = _heads(8, 50)
    head = linear if path == "linear" else wrapped
    hidden = torch.randn(13, 8, requires_grad=True)
    targets = torch.randint(50, (13,))
    results = []
    for chunked in (True, False):
        linear.zero_grad()
        hidden.grad = None
        if chunked:
            logp, _ = chunked_head_logprobs(hidden, targets, head, temperature=1.3, chunk_size=5)
        else:
            logp = naive_head_logprobs(hidden, targets, head, temperature=1.3)
        (logp * torch.arange(13.0)).sum().backward()
        grads = (hidden.grad.clone(), linear.weight.grad.clone(), linear.bias.grad.clone())
        results.append((logp.detach(), *grads))
    for got, ref in zip(*results, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_frozen_head_gets_no_gradient_but_hidden_does() -> None:
    head = torch.nn.Linear(8, 50).requires_grad_(False)
    hidden = torch.randn(6, 8, requires_grad=True)
    targets = torch.randint(50, (6,))
    chunked_head_logprobs(hidden, targets, head, chunk_size=4)[0].sum().backward()
    ref = hidden.grad.clone()
    hidden.grad = None
    naive_head_logprobs(hidden, targets, head).sum().backward()
    assert head.weight.grad is None
    torch.testing.assert_close(ref, hidden.grad, atol=1e-6, rtol=1e-5)


def _largest_saved_tensor(fn) -> int:
    """numel of the largest tensor autograd saves for backward while running fn()."""
    sizes = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


@pytest.mark.parametrize("path", [0, 1])
def test_chunked_saves_no_logits(path: int) -> None:
    rows, vocab = 64, 1000
    head = _heads(8, vocab)[path]
    hidden = torch.randn(rows, 8, requires_grad=True)
    targets = torch.randint(vocab, (rows,))
    naive = _largest_saved_tensor(lambda: naive_head_logprobs(hidden, targets, head))
    chunked = _largest_saved_tensor(
        lambda: chunked_head_logprobs(hidden, targets, head, chunk_size=16, with_entropy=True)
    )
    assert naive >= rows * vocab  # the test can see a full logits tensor...
    assert chunked < 16 * vocab  # ...and the chunked path keeps none, not even one chunk's


@pytest.mark.parametrize(
    ("response_len", "shape", "message"),
    [(0, (2, 6), "response_len"), (6, (2, 6), "response_len"), (2, (12,), r"\[batch, length\]")],
)
def test_bad_input_is_named(model, response_len: int, shape: tuple, message: str) -> None:
    ids = torch.ones(shape, dtype=torch.long)
    with pytest.raises(ValueError, match=message):
        response_logprobs(model, ids, torch.ones_like(ids), response_len)


def test_bad_mask_and_temperature(model) -> None:
    ids = torch.ones(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="attention_mask shape"):
        response_logprobs(model, ids, torch.ones(2, 5, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="temperature"):
        response_logprobs(model, ids, torch.ones_like(ids), 2, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        response_logprobs(model, ids, torch.ones_like(ids), 2, chunk_size=0)


def grouped_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """`batch()` with each prompt repeated: rows (0, 3), (1, 4) and (2, 5) share a prompt and
    have different responses (the layout of G responses per prompt)."""
    ids, mask, _, _ = batch()
    ids, mask = ids.repeat(2, 1), mask.repeat(2, 1)
    gen = torch.Generator().manual_seed(2)
    ids[3:, 7:] = torch.where(mask[3:, 7:] > 0, torch.randint(4, 101, (3, R), generator=gen), 0)
    return ids, mask


def test_shared_prompts_take_one_prompt_pass_and_equal_naive(model) -> None:
    ids, mask = grouped_batch()
    lengths: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: lengths.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    kwargs = {"temperature": 0.7, "with_entropy": True, "with_hidden": True}
    try:
        got = response_logprobs(model, ids, mask, R, chunk_size=4, **kwargs)
    finally:
        hook.remove()
    assert lengths == [3, 6]  # the 3 distinct prompts, then the 6 responses
    ref = naive_response_logprobs(model, ids, mask, R, **kwargs)
    torch.testing.assert_close(got.logp, ref.logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropies, ref.entropies, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.hidden, ref.hidden, atol=1e-5, rtol=0)


def test_shared_prompt_gradients_equal_naive(model) -> None:
    """The prompt pass gets the gradient of every response that reads its KV cache."""
    ids, mask = grouped_batch()
    weights = torch.randn(6, R, generator=torch.Generator().manual_seed(3))
    grads = []
    for fn in (response_logprobs, naive_response_logprobs):
        model.zero_grad()
        (fn(model, ids, mask, R, temperature=0.7).logp * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    model.zero_grad()
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_shared_prompts_with_a_one_token_response(model) -> None:
    ids, mask = grouped_batch()
    ids, mask = ids[:, : 7 + 1], mask[:, : 7 + 1]
    got = response_logprobs(model, ids, mask, 1, with_hidden=True)
    ref = naive_response_logprobs(model, ids, mask, 1, with_hidden=True)
    torch.testing.assert_close(got.logp, ref.logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.hidden, ref.hidden, atol=1e-5, rtol=0)


def test_shared_prompts_fall_back_under_activation_checkpointing(model) -> None:
    """Checkpointed layers drop the KV cache: one plain pass, the same log-probs and grads."""
    ids, mask = grouped_batch()
    ckpt = copy.deepcopy(model)
    if hasattr(ckpt, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
        ckpt.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ckpt.train()
    got = response_logprobs(ckpt, ids, mask, R).logp
    ref = naive_response_logprobs(model, ids, mask, R).logp
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    got.sum().backward()
    assert ckpt.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
