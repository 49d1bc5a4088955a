"""LRP: no leakage from the memory bank, the fusion formula, the three phases, and the
surrogate baseline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policyopt.envs.ads.adsim.abtest import AdPlatform
from policyopt.envs.ads.adsim.history import make_history
from policyopt.envs.ads.lrp.features import MemoryBank, build_bank, build_samples
from policyopt.envs.ads.lrp.model import LRP
from policyopt.envs.ads.lrp.surrogate import SurrogateIndex
from policyopt.envs.ads.lrp.train import LRPTrainConfig, predicted_arm_values, train_lrp


@pytest.fixture(scope="module")
def history():
    return make_history(AdPlatform(seed=0, users_per_arm=60), 24, per_day=2)


def test_bank_entries_from_the_future_do_not_change_a_prediction(history):
    torch.manual_seed(0)
    model = LRP(16).eval()
    bank = build_bank(history, 10.0, 2.0)
    s = build_samples(history[18:19])  # starts on day 9: experiments of days 0-2 matured
    target_day = int(s.start_day[0])
    later = bank.matured_day > target_day
    assert later.any() and (~later).any()
    base = model.predict(s.x_agn, s.x_spe, s.start_day, bank)
    # scramble every entry that matured after the target started: nothing changes
    scrambled = MemoryBank(
        torch.where(later[:, None], torch.randn_like(bank.keys) * 9, bank.keys),
        torch.where(later[:, None], torch.randn_like(bank.values) * 9, bank.values),
        bank.matured_day,
    )
    torch.testing.assert_close(model.predict(s.x_agn, s.x_spe, s.start_day, scrambled), base)
    # drop them: nothing changes either
    kept = MemoryBank(bank.keys[~later], bank.values[~later], bank.matured_day[~later])
    torch.testing.assert_close(model.predict(s.x_agn, s.x_spe, s.start_day, kept), base)


def test_a_visible_entry_does_change_the_prediction(history):
    torch.manual_seed(0)
    model = LRP(16).eval()
    bank = build_bank(history, 10.0, 2.0)
    s = build_samples(history[-1:])  # the last day: earlier experiments have matured
    visible = bank.visible(s.start_day)[0]
    assert visible.any()
    base = model.predict(s.x_agn, s.x_spe, s.start_day, bank)
    values = bank.values.clone()
    values[visible] += 5.0
    moved = model.predict(
        s.x_agn, s.x_spe, s.start_day, MemoryBank(bank.keys, values, bank.matured_day)
    )
    assert not torch.allclose(moved, base)


def test_visibility_rule():
    bank = MemoryBank(torch.zeros(3, 19), torch.zeros(3, 14), torch.tensor([3, 7, 8]))
    assert bank.visible(torch.tensor([7])).tolist() == [[True, True, False]]


def test_fusion_formula_by_parts(history):
    torch.manual_seed(1)
    model = LRP(8).eval()
    bank = build_bank(history, 10.0, 2.0)
    s = build_samples(history[-2:])
    x = (s.x_agn - model.x_mean) / model.x_std
    z_agn = model.e_agn(x)
    z_spe = model.e_spe(torch.cat([x, s.x_spe], -1))
    q = torch.cat([z_agn, z_spe], -1)
    # attention by hand over the visible entries of each row
    rows = []
    for i in range(len(q)):
        vis = bank.matured_day <= s.start_day[i]
        a = torch.softmax(model.w_q(q[i]) @ model.w_k(bank.keys[vis]).T / 8**0.5, -1)
        rows.append(a @ model.w_v(bank.values[vis]))
    z = z_agn + z_spe + torch.sigmoid(model.gate(q)) * torch.stack(rows)
    expected = model.head(z).squeeze(-1)
    got, _ = model(s.x_agn, s.x_spe, s.start_day, bank)
    torch.testing.assert_close(got, expected)


def test_sum_fusion_drops_the_gate(history):
    """The fusion ablation (`fusion="sum"`): z = z_agn + z_spe + z_trans, no σ(W_g q + b)."""
    torch.manual_seed(1)
    model = LRP(8, fusion="sum").eval()
    bank = build_bank(history, 10.0, 2.0)
    s = build_samples(history[-2:])
    x = (s.x_agn - model.x_mean) / model.x_std
    z_agn = model.e_agn(x)
    z_spe = model.e_spe(torch.cat([x, s.x_spe], -1))
    q = torch.cat([z_agn, z_spe], -1)
    z = z_agn + z_spe + model.attend(q, s.start_day, bank)
    got, _ = model(s.x_agn, s.x_spe, s.start_day, bank)
    torch.testing.assert_close(got, model.head(z).squeeze(-1))
    gated = LRP(8).eval()
    gated.load_state_dict(model.state_dict())
    assert not torch.allclose(gated(s.x_agn, s.x_spe, s.start_day, bank)[0], got)


def test_unknown_fusion_is_refused():
    with pytest.raises(ValueError, match="fusion"):
        LRP(8, fusion="concat")


def test_fusion_survives_save_and_load(history, tmp_path):
    from policyopt.envs.ads.lrp.io import load_lrp, save_lrp

    model = LRP(8, fusion="sum").eval()
    bank = build_bank(history, 10.0, 2.0)
    loaded, _ = load_lrp(save_lrp(tmp_path / "lrp", model, bank))
    assert loaded.fusion == "sum"


def test_no_visible_entry_means_no_transfer_term(history):
    model = LRP(8).eval()
    s = build_samples(history[:1])  # day 0: nothing has matured
    bank = build_bank(history, 10.0, 2.0)
    q = torch.randn(s.x_agn.shape[0], 16)
    assert model.attend(q, s.start_day, bank).abs().max() == 0


def test_three_phases_train_and_freeze(history):
    cfg = LRPTrainConfig(hidden=16, warmup_epochs=30, disc_epochs=10, joint_epochs=10)
    model, metrics = train_lrp(history, cfg)
    assert {"lrp/warmup_loss", "lrp/disc_loss", "lrp/joint_loss", "lrp/disc_accuracy"} <= set(
        metrics
    )
    assert not any(p.requires_grad for p in model.parameters())


def _params(model, prefix):
    return {n: p.clone() for n, p in model.named_parameters() if n.startswith(prefix)}


def test_discriminator_phase_moves_only_the_discriminator(history):
    base = dict(hidden=16, warmup_epochs=20, joint_epochs=0)
    warm, _ = train_lrp(history, LRPTrainConfig(**base, disc_epochs=0))
    disc, _ = train_lrp(history, LRPTrainConfig(**base, disc_epochs=15))
    for prefix in ("e_agn.", "e_spe.", "head.", "w_q.", "gate."):
        for n, p in _params(warm, prefix).items():
            torch.testing.assert_close(_params(disc, prefix)[n], p, msg=f"{n} moved")
    moved = [
        not torch.equal(p, _params(disc, "discriminator.")[n])
        for n, p in _params(warm, "discriminator.").items()
    ]
    assert all(moved)


def test_gradient_reversal_makes_populations_harder_to_tell_apart(history):
    """The joint phase with λ_adv > 0 pushes E_agn to hide the population: a discriminator
    trained afresh on the frozen z_agn does worse than after the same training with λ_adv = 0.
    (120 joint epochs since the inputs grew to 14 parameters: at 60 the probe's losses were
    0.376 against 0.394, within noise.)"""

    def probe_loss(adv_lambda):
        cfg = LRPTrainConfig(
            hidden=16, warmup_epochs=20, disc_epochs=20, joint_epochs=120, adv_lambda=adv_lambda
        )
        model, _ = train_lrp(history, cfg)
        s = build_samples(history)
        z = model.e_agn((s.x_agn - model.x_mean) / model.x_std).detach()
        torch.manual_seed(0)
        probe = torch.nn.Sequential(
            torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)
        )
        opt = torch.optim.Adam(probe.parameters(), lr=1e-2)
        for _ in range(200):
            loss = torch.nn.functional.cross_entropy(probe(z), s.pop)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return float(loss.detach())

    assert probe_loss(5.0) > probe_loss(0.0) + 0.05


def test_lrp_beats_a_constant_on_its_training_effects(history):
    model, _ = train_lrp(
        history, LRPTrainConfig(hidden=16, warmup_epochs=150, disc_epochs=10, joint_epochs=30)
    )
    bank = build_bank(history, float(model.y_mean), float(model.y_std))
    v = predicted_arm_values(model, history, bank)
    assert v.shape == (len(history), 2) and np.isfinite(v).all()
    true = np.array([e.effect for e in history])
    mse = np.mean((v[:, 1] - v[:, 0] - true) ** 2)
    assert mse < 0.5 * np.var(true)


def test_surrogate_recovers_an_exact_linear_relation(history):
    from policyopt.envs.ads.lrp.surrogate import day1_deltas

    x = day1_deltas(history)
    coef = np.array([0.5, -1.0, 2.0, 0.0, 3.0])

    class E:  # an experiment whose effect is exactly linear in its day-1 deltas
        def __init__(self, e, effect):
            self.arms, self.effect = e.arms, effect

    fake = [E(e, float(x[i] @ coef + 0.25)) for i, e in enumerate(history)]
    sur = SurrogateIndex(ridge=0.0).fit(fake)
    np.testing.assert_allclose(sur.coef, [*coef, 0.25], atol=1e-6)
