"""The long-term reward predictor (LRP, SPEC §7): day-1 signals -> 7-day value per user.

    z_agn   = E_agn(x_agn)                       population-agnostic encoder
    z_spe   = E_spe([x_agn, one-hot p, share])   population-specific encoder
    logits  = D(grad_reverse(z_agn, 1))          adversarial population discriminator
    q       = [z_agn; z_spe]
    z_trans = Σ_m softmax_m(W_q q · W_k k_m / √h) W_v v_m   over visible bank entries m
              (matured before the target started; 0 when none is)
    z       = z_agn + z_spe + σ(W_g q + b) ⊙ z_trans   (fusion="gated", the paper's)
              z_agn + z_spe + z_trans                 (fusion="sum", the ablation)
    ŷ       = MLP(z)

Inputs and bank entries: `lrp_features.py`. Training (three phases): `lrp_train.py`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from policyopt.envs.ads.adsim.abtest import POPS
from policyopt.envs.ads.lrp.features import (
    AGN_DIM,
    KEY_DIM,
    SPE_EXTRA,
    VALUE_DIM,
    MemoryBank,
)
from policyopt.methods.dmrl.grad_reverse import grad_reverse


def _mlp(d_in: int, hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))


FUSIONS = ("gated", "sum")


class LRP(nn.Module):
    def __init__(self, hidden: int = 64, fusion: str = "gated") -> None:
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"LRP fusion must be one of {FUSIONS}, got {fusion!r}")
        self.hidden = hidden
        self.fusion = fusion
        self.e_agn = _mlp(AGN_DIM, hidden, hidden)
        self.e_spe = _mlp(AGN_DIM + SPE_EXTRA, hidden, hidden)
        self.discriminator = _mlp(hidden, hidden, POPS)
        self.w_q = nn.Linear(2 * hidden, hidden)
        self.w_k = nn.Linear(KEY_DIM, hidden)
        self.w_v = nn.Linear(VALUE_DIM, hidden)
        self.gate = nn.Linear(2 * hidden, hidden)
        self.head = _mlp(hidden, hidden, 1)
        # Input standardisation, set from the training rows (`fit_scaler`).
        self.register_buffer("x_mean", torch.zeros(AGN_DIM))
        self.register_buffer("x_std", torch.ones(AGN_DIM))
        self.register_buffer("y_mean", torch.zeros(()))
        self.register_buffer("y_std", torch.ones(()))

    def fit_scaler(self, x_agn: Tensor, y: Tensor) -> None:
        self.x_mean.copy_(x_agn.mean(0))
        self.x_std.copy_(x_agn.std(0).clamp(min=1e-3))
        self.y_mean.copy_(y.mean())
        self.y_std.copy_(y.std().clamp(min=1e-6))

    def forward(
        self,
        x_agn: Tensor,
        x_spe: Tensor,
        start_day: Tensor,
        bank: MemoryBank,
        adv_lambda: float = 1.0,
    ) -> tuple[Tensor, Tensor]:
        """(ŷ standardised [S], discriminator logits [S, 4])."""
        x = (x_agn - self.x_mean) / self.x_std
        z_agn = self.e_agn(x)
        z_spe = self.e_spe(torch.cat([x, x_spe], -1))
        logits = self.discriminator(grad_reverse(z_agn, adv_lambda))
        q = torch.cat([z_agn, z_spe], -1)
        z_trans = self.attend(q, start_day, bank)
        if self.fusion == "gated":
            z_trans = torch.sigmoid(self.gate(q)) * z_trans
        z = z_agn + z_spe + z_trans
        return self.head(z).squeeze(-1), logits

    def attend(self, q: Tensor, start_day: Tensor, bank: MemoryBank) -> Tensor:
        """Cross-attention over the bank entries each target may see [S, h]."""
        if len(bank) == 0:
            return q.new_zeros(q.shape[0], self.hidden)
        scores = self.w_q(q) @ self.w_k(bank.keys).T / math.sqrt(self.hidden)  # [S, M]
        visible = bank.visible(start_day)
        scores = scores.masked_fill(~visible, float("-inf"))
        any_visible = visible.any(1, keepdim=True)
        attn = torch.softmax(torch.where(any_visible, scores, 0.0), -1) * any_visible
        return attn @ self.w_v(bank.values)

    def predict(self, x_agn: Tensor, x_spe: Tensor, start_day: Tensor, bank: MemoryBank) -> Tensor:
        """7-day value per user in the label's units [S] (no grad)."""
        with torch.no_grad():
            y, _ = self.forward(x_agn, x_spe, start_day, bank)
        return y * self.y_std + self.y_mean
