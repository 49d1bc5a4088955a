"""Training the LRP in three phases, and its evaluation on held-out experiments.

Loss on standardised labels: MSE of each (arm, population) 7-day value, plus MSE of each
population's treatment − control effect (scaled by the effects' std, so that the small
differences the DRPO reward depends on weigh as much as the levels), plus
λ_adv × the discriminator's cross-entropy (through the gradient-reversal layer):

1. warm-up     (`warmup_epochs`): encoders, attention, head on the MSE; λ_adv = 0;
2. discriminator pre-training (`disc_epochs`): the discriminator alone, encoders frozen;
3. joint       (`joint_epochs`): everything, MSE + λ_adv · cross-entropy, the encoder
   receiving −λ_adv × the discriminator's gradient.
Full-batch AdamW (the data are a few thousand rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import spearmanr
from torch import Tensor

from policyopt.envs.ads.adsim.abtest import POPS, Experiment
from policyopt.envs.ads.lrp.features import MemoryBank, Samples, build_bank, build_samples
from policyopt.envs.ads.lrp.model import LRP


@dataclass
class LRPTrainConfig:
    hidden: int = 64
    lr: float = 3e-3
    weight_decay: float = 1e-4
    warmup_epochs: int = 300
    disc_epochs: int = 100
    joint_epochs: int = 300
    adv_lambda: float = 0.1  # λ_adv (unpublished)
    seed: int = 0
    # False: train (and use) the LRP with an empty memory bank (the ablation without it)
    use_bank: bool = True
    # "gated": z = z_agn + z_spe + σ(W_g q + b) ⊙ z_trans (the paper); "sum": no gate (ablation)
    fusion: str = "gated"
    # torch threads while training: the matrices are small, and on a busy 2-core machine
    # two threads were 25x slower than one (0.9 s vs 24 s for the unit test's setting).
    num_threads: int = 1


def _effects(y: Tensor) -> Tensor:
    """Per (experiment, population) treatment − control [E, 4] from arm-major rows [E·8]."""
    y = y.view(-1, 2, POPS)
    return y[:, 1] - y[:, 0]


def train_lrp(
    experiments: list[Experiment], cfg: LRPTrainConfig | None = None
) -> tuple[LRP, dict[str, float]]:
    """The trained, frozen LRP and its training metrics."""
    cfg = cfg or LRPTrainConfig()
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        return _train(experiments, cfg)
    finally:
        torch.set_num_threads(threads)


def _train(experiments: list[Experiment], cfg: LRPTrainConfig) -> tuple[LRP, dict[str, float]]:
    torch.manual_seed(cfg.seed)
    s = build_samples(experiments)
    model = LRP(cfg.hidden, cfg.fusion)
    model.fit_scaler(s.x_agn, s.y)
    bank = (
        build_bank(experiments, float(model.y_mean), float(model.y_std))
        if cfg.use_bank
        else MemoryBank.empty()
    )
    y = (s.y - model.y_mean) / model.y_std
    eff_std = float(_effects(y).std().clamp(min=1e-6))
    disc = list(model.discriminator.parameters())
    rest = [p for n, p in model.named_parameters() if not n.startswith("discriminator.")]
    ce = torch.nn.functional.cross_entropy
    metrics: dict[str, float] = {}

    def mse(pred: Tensor) -> Tensor:
        level = ((pred - y) ** 2).mean()
        effect = (((_effects(pred) - _effects(y)) / eff_std) ** 2).mean()
        return level + effect

    def run(params: list[Tensor], epochs: int, phase: str) -> None:
        if epochs == 0:  # a phase switched off (ablations): nothing trained, no loss logged
            return
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        for _ in range(epochs):
            pred, logits = model(s.x_agn, s.x_spe, s.start_day, bank, adv_lambda=1.0)
            if phase == "warmup":
                loss = mse(pred)
            elif phase == "disc":
                z = model.e_agn((s.x_agn - model.x_mean) / model.x_std).detach()
                loss = ce(model.discriminator(z), s.pop)
            else:
                loss = mse(pred) + cfg.adv_lambda * ce(logits, s.pop)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        metrics[f"lrp/{phase}_loss"] = float(loss.detach())

    run(rest, cfg.warmup_epochs, "warmup")
    run(disc, cfg.disc_epochs, "disc")
    run(rest + disc, cfg.joint_epochs, "joint")
    with torch.no_grad():
        _, logits = model(s.x_agn, s.x_spe, s.start_day, bank)
    metrics["lrp/disc_accuracy"] = float((logits.argmax(-1) == s.pop).float().mean())
    model.eval().requires_grad_(False)
    return model, metrics


def predicted_arm_values(model: LRP, experiments: list[Experiment], bank: MemoryBank) -> np.ndarray:
    """LRP's 7-day value per user of (control, treatment) for each experiment [E, 2]."""
    s: Samples = build_samples(experiments)
    y = model.predict(s.x_agn, s.x_spe, s.start_day, bank)
    return (y * s.weight).view(-1, 2, POPS).sum(-1).numpy()


def evaluate_effects(predicted: np.ndarray, experiments: list[Experiment]) -> dict[str, float]:
    """Spearman and MSE of predicted vs true 7-day effects."""
    true = np.array([e.effect for e in experiments])
    return {
        "spearman": float(spearmanr(predicted, true)[0]),
        "mse": float(np.mean((predicted - true) ** 2)),
    }
