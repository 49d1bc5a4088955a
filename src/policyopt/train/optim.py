"""AdamW with linear warm-up and a constant, linear or cosine schedule."""

from __future__ import annotations

import math

import torch

from policyopt.config.load import OptimConfig


def build_optimizer(
    params: list[torch.nn.Parameter], cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    if not params:
        raise ValueError("the model has no trainable parameters")
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.schedule, cfg.warmup_steps, total_steps)
    )


def lr_lambda(schedule: str, warmup: int, total: int):  # noqa: ANN201 - a closure
    """Multiplier of the base lr at optimizer step s."""

    def factor(s: int) -> float:
        if warmup and s < warmup:
            return (s + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
