"""GAR's gradient signal: closed form vs autograd through the output layer alone (with and
without bias, tied weights, a LoRA-wrapped head), the factorisation, batched vs per row, and
the chunking."""

import pytest
import torch
from torch.nn import functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import policyopt.methods.gar.signal as signal
from policyopt.methods.gar import (
    batched_gradient_signal,
    gradient_signal,
    output_layer,
    prediction_error_factor,
)

torch.set_num_threads(1)


def autograd_signal(hidden, head, targets):
    """normalise(mean_t (∂L/∂h_t ⊙ h_t)), L = mean CE over the tokens, by autograd on `head`."""
    h = hidden.detach().clone().requires_grad_(True)
    loss = F.cross_entropy(head(h), targets)
    (grad,) = torch.autograd.grad(loss, h)
    s_bar = (grad * h.detach()).mean(0)
    return s_bar / s_bar.norm()


def random_problem(t=7, v=11, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, d, generator=g, dtype=torch.float64)
    weight = torch.randn(v, d, generator=g, dtype=torch.float64)
    bias = torch.randn(v, generator=g, dtype=torch.float64)
    targets = torch.randint(0, v, (t,), generator=g)
    return hidden, weight, bias, targets


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_closed_form_equals_autograd(with_bias, chunk_size):
    hidden, weight, bias, targets = random_problem()
    bias = bias if with_bias else None
    expected = autograd_signal(hidden, lambda h: F.linear(h, weight, bias), targets)
    got = gradient_signal(hidden, weight, bias, targets, chunk_size=chunk_size)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert got.norm().item() == pytest.approx(1.0)
    if with_bias:  # the bias matters: dropping it changes v
        assert not torch.allclose(got, gradient_signal(hidden, weight, None, targets))


def test_tied_weights_of_a_model():
    config = LlamaConfig(
        vocab_size=13,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).double()
    weight, bias = output_layer(model)
    assert weight is model.get_input_embeddings().weight and bias is None
    captured = []
    model.lm_head.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    ids = torch.randint(0, 13, (1, 9))
    with torch.no_grad():
        model(input_ids=ids)
    hidden, targets = captured[0][0, :-1], ids[0, 1:]  # h_t predicts token t + 1
    expected = autograd_signal(hidden, model.lm_head, targets)
    torch.testing.assert_close(gradient_signal(hidden, weight, bias, targets), expected)


def test_lora_wrapped_head_uses_the_effective_weight():
    from policyopt.models.lora import apply_lora, disabled_adapter

    config = LlamaConfig(
        vocab_size=13,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    torch.manual_seed(0)
    model = apply_lora(LlamaForCausalLM(config), rank=2, target_modules=["lm_head"])
    head = model.get_output_embeddings()
    torch.nn.init.normal_(head.lora_B["default"].weight)  # B = 0 at init: make the delta real
    h = torch.randn(4, 8)
    weight, bias = output_layer(model)
    torch.testing.assert_close(F.linear(h, weight, bias), head(h))
    assert not torch.allclose(weight, head.base_layer.weight)
    with disabled_adapter(model):
        torch.testing.assert_close(output_layer(model)[0], head.base_layer.weight)


def test_factorisation_into_prediction_error_and_activation():
    hidden, weight, bias, targets = random_problem(t=6, v=9, d=4, seed=1)
    t = len(targets)
    h = hidden.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(F.linear(h, weight, bias), targets), h)
    s = grad * hidden  # S_t,j from autograd
    # prediction-error factor [W^T (p_t − e_y)]_j / T, by hand from the softmax
    p = torch.softmax(hidden @ weight.T + bias, -1) - F.one_hot(targets, 9)
    error = p @ weight / t
    torch.testing.assert_close(prediction_error_factor(hidden, weight, bias, targets) / t, error)
    torch.testing.assert_close(s, error * hidden, rtol=1e-10, atol=1e-12)  # S = error ⊙ h
    s_bar = s.mean(0)
    torch.testing.assert_close(gradient_signal(hidden, weight, bias, targets), s_bar / s_bar.norm())


def test_batched_equals_per_row_and_ignores_masked_positions():
    g = torch.Generator().manual_seed(2)
    n, width, d, v = 4, 6, 5, 10
    hidden = torch.randn(n, width, d, generator=g, dtype=torch.float64)
    weight = torch.randn(v, d, generator=g, dtype=torch.float64)
    bias = torch.randn(v, generator=g, dtype=torch.float64)
    targets = torch.randint(0, v, (n, width), generator=g)
    mask = torch.zeros(n, width)
    mask[0, :6] = 1
    mask[1, :2] = 1
    mask[2, 1:4] = 1  # a span inside the response
    # row 3: no tokens -> v = 0
    got = batched_gradient_signal(hidden, mask, weight, bias, targets, chunk_size=4)
    for i in range(3):
        keep = mask[i].bool()
        expected = gradient_signal(hidden[i, keep], weight, bias, targets[i, keep])
        torch.testing.assert_close(got[i], expected, rtol=1e-10, atol=1e-12)
    assert torch.equal(got[3], torch.zeros(d, dtype=torch.float64))
    hidden_changed = hidden.clone()
    hidden_changed[1, 2:] = 1e3  # outside row 1's mask: must not matter
    again = batched_gradient_signal(hidden_changed, mask, weight, bias, targets, chunk_size=4)
    torch.testing.assert_close(again[1], got[1])


def test_logits_are_formed_at_most_chunk_size_tokens_at_a_time(monkeypatch):
    hidden, weight, bias, targets = random_problem(t=10)
    rows = []

    def counting(h, *args):
        rows.append(len(h))
        return prediction_error_factor(h, *args)

    monkeypatch.setattr(signal, "prediction_error_factor", counting)
    gradient_signal(hidden, weight, bias, targets, chunk_size=4)
    assert rows == [4, 4, 2]


def test_shape_errors():
    hidden, weight, bias, targets = random_problem()
    with pytest.raises(ValueError, match="hidden size"):
        gradient_signal(hidden[:, :3], weight, bias, targets)
    with pytest.raises(ValueError, match="targets"):
        gradient_signal(hidden, weight, bias, targets[:3])
    with pytest.raises(ValueError, match="chunk_size"):
        gradient_signal(hidden, weight, bias, targets, chunk_size=0)
