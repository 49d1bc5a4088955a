from __future__ import annotations

import torch

from policyopt.methods.dmrl import grad_reverse


def test_identity_forward_reversed_scaled_gradient():
    x = torch.randn(5, 3, requires_grad=True)
    w = torch.randn(5, 3)
    y = grad_reverse(x, 0.7)
    torch.testing.assert_close(y, x)
    (y * w).sum().backward()
    torch.testing.assert_close(x.grad, -0.7 * w)


def test_backward_is_minus_lam_times_the_finite_difference_gradient():
    # f(x) = Σ sin(x)·x: the reversed layer's analytic gradient is −lam × the numerical one.
    x = torch.randn(4, dtype=torch.double, requires_grad=True)
    lam, h = 2.5, 1e-6

    def f(v):
        return (torch.sin(v) * v).sum()

    analytic = torch.autograd.grad(f(grad_reverse(x, lam)), x)[0]
    eye = torch.eye(4, dtype=torch.double)
    numeric = torch.stack([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in eye]).detach()
    torch.testing.assert_close(analytic, -lam * numeric)


def test_upstream_layers_get_the_reversed_gradient():
    lin = torch.nn.Linear(3, 2)
    head = torch.nn.Linear(2, 1)
    x = torch.randn(6, 3)
    head(lin(x)).sum().backward()
    plain = lin.weight.grad.clone()
    lin.zero_grad()
    head(grad_reverse(lin(x), 1.0)).sum().backward()
    torch.testing.assert_close(lin.weight.grad, -plain)
