"""KL penalty estimators by hand and against the exact KL of a small distribution."""

import math

import pytest
import torch

from policyopt.core import KL_ESTIMATORS, kl_penalty

torch.set_num_threads(1)
F64 = torch.float64


def test_estimators_by_hand():
    # logp = [0, −1], ref = [−1, 0]: logp − ref = [1, −1]
    # k1 = [1, −1]; k2 = ½ [1, 1]; k3 with d = ref − logp = [−1, 1]:
    #   e^−1 + 1 − 1 = 0.367879;  e^1 − 1 − 1 = 0.718282
    logp = torch.tensor([[0.0, -1.0]], dtype=F64)
    ref = torch.tensor([[-1.0, 0.0]], dtype=F64)
    assert kl_penalty(logp, ref, "k1").tolist() == [[1.0, -1.0]]
    assert kl_penalty(logp, ref, "k2").tolist() == [[0.5, 0.5]]
    k3 = torch.tensor([[math.exp(-1), math.e - 2]], dtype=F64)
    assert torch.allclose(kl_penalty(logp, ref, "k3"), k3)
    assert torch.equal(kl_penalty(logp, ref, "low_var_kl"), kl_penalty(logp, ref, "k3"))


def test_k3_is_clamped():
    # d = 30 -> clamped to 20, e^20 − 21 ≫ 10 -> 10; d = −30 -> −20: e^−20 + 20 − 1 ≈ 19 -> 10
    logp = torch.tensor([0.0, 30.0, 0.5])
    ref = torch.tensor([30.0, 0.0, 0.5])
    assert kl_penalty(logp, ref, "k3").tolist() == [10.0, 10.0, 0.0]


def test_k1_and_k3_expectations_equal_exact_kl():
    # Summed against π_θ's own probabilities, k1 and k3 give KL(π_θ || π_ref) exactly:
    # Σ p (q/p − log(q/p) − 1) = 1 − Σ p log(q/p) − 1 = KL(p || q).
    p = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=F64)
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist(), strict=True))
    for name in ("k1", "k3"):
        per_token = kl_penalty(p.log()[None], q.log()[None], name)[0]
        assert (p * per_token).sum().item() == pytest.approx(exact, rel=1e-12)


def test_k2_and_k3_gradients_vanish_at_equality():
    logp = torch.tensor([-0.7, -2.0], requires_grad=True)
    for name in ("k2", "k3"):
        (grad,) = torch.autograd.grad(kl_penalty(logp, logp.detach(), name).sum(), logp)
        assert grad.abs().max() == 0


def test_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(KeyError, match="valid names: k1, k2, k3, low_var_kl"):
        kl_penalty(x, x, "k4")
    with pytest.raises(ValueError, match="same shape"):
        kl_penalty(x, x[:, :2], "k1")
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3", "low_var_kl"]
