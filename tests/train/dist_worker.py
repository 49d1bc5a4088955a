"""Worker for tests/train/test_distributed.py: one policy update on a fixed global batch.

Run alone (`python dist_worker.py OUT`): the single-process reference. Under torchrun with 2
processes: the same global batch split by whole groups over the ranks, once under DDP and
once under FSDP2. Rank 0 writes, per scenario, the loss, the grad norm and the gradients
each optimizer step saw (full tensors), to OUT/<mode>.pt; it also checks that the advantages
computed from each rank's rewards with `global_rows` equal the global batch's.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import torch

from policyopt.config.load import Config
from policyopt.core import compute_advantages
from policyopt.core.aggregation import AGG_MODES
from policyopt.models.loading import load_model
from policyopt.rollout.base import Rollouts
from policyopt.train.batch import Batch
from policyopt.train.distributed import Dist, global_rows, setup, wrap_policy
from policyopt.train.parts import bound_loss
from policyopt.train.update import Optimization, update

GROUP_SIZES = (3, 3, 2, 2)  # rank 0 of 2 gets groups 0-1 (6 rows), rank 1 groups 2-3 (4)
P, R = 6, 7
SCENARIOS = {
    **{agg: {"agg": agg} for agg in AGG_MODES},
    # Sequence-level loss, and the KL term with a reference model.
    "gspo": {"loss": "gspo"},
    "kl": {"agg": "token-mean", "kl_coef": 0.05},
}


def global_batch() -> Batch:
    """10 rollouts in 4 groups: ragged prompts (left padding) and responses, one response
    without a valid loss token (filtered), random rewards."""
    g = torch.Generator().manual_seed(0)
    group_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(GROUP_SIZES)])
    n = len(group_ids)
    prompt_ids = torch.zeros(n, P, dtype=torch.long)
    prompt_mask = torch.zeros(n, P, dtype=torch.long)
    for gid in range(len(GROUP_SIZES)):
        length = int(torch.randint(2, P + 1, (1,), generator=g))
        ids = torch.randint(3, 30, (length,), generator=g)
        rows = group_ids == gid
        prompt_ids[rows, P - length :] = ids
        prompt_mask[rows, P - length :] = 1
    lengths = torch.randint(1, R + 1, (n,), generator=g)
    response_mask = (torch.arange(R)[None] < lengths[:, None]).float()
    response_ids = torch.randint(3, 30, (n, R), generator=g) * response_mask.long()
    rollouts = Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logp=torch.zeros(n, R),
        entropies=torch.rand(n, R, generator=g),
        truncated=lengths == R,
        generated_tokens=int(lengths.sum()),
    )
    rewards = torch.rand(n, generator=g)
    loss_mask = response_mask.clone()
    loss_mask[4] = 0  # a filtered response: counts in no normaliser
    return Batch(
        rollouts=rollouts,
        group_ids=group_ids,
        prompts=[""] * n,
        completions=[""] * n,
        columns={},
        rewards={"total": rewards},
        advantages=compute_advantages("grpo", rewards, group_ids),
        loss_mask=loss_mask,
    )


def rank_rows(dist: Dist) -> torch.Tensor:
    """This rank's rows: whole groups, the first half of the groups to rank 0."""
    group_ids = global_batch().group_ids
    per_rank = len(GROUP_SIZES) // dist.world
    mine = torch.arange(dist.rank * per_rank, (dist.rank + 1) * per_rank)
    return torch.isin(group_ids, mine).nonzero().squeeze(-1)


def take(batch: Batch, rows: torch.Tensor) -> Batch:
    return batch.select(torch.isin(torch.arange(len(batch)), rows))


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the full gradient of every parameter at each step (DTensor shards
    gathered), so the test compares gradients, not only their effect."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float) -> None:
        super().__init__(params, lr=lr)
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        grads = []
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                full = getattr(g, "full_tensor", None)
                grads.append((full() if callable(full) else g).detach().clone())
        self.seen.append(grads)
        return super().step(closure)


def run_scenario(dist: Dist, options: dict) -> dict:
    torch.manual_seed(0)
    config = Config.model_validate(
        {
            "rollout": {"max_new_tokens": R},
            "train": {"micro_batch_size": 2, "parallel": dist.mode},
            # Two passes: the second is off-policy (ratios away from 1, clipping active).
            "algorithm": {"ppo_epochs": 2, "clip_low": 0.05, "clip_high": 0.05, **options},
            "model": {"logit_chunk_size": 5},
        }
    )
    model, _ = load_model("tiny")
    ref = None
    if config.algorithm.kl_coef > 0:
        ref = load_model("tiny")[0].eval().requires_grad_(False)
        with torch.no_grad():  # a reference that differs from the policy
            for p in ref.parameters():
                p.mul_(0.9)
    logp_options = {"temperature": 1.0, "chunk_size": config.model.logit_chunk_size}
    policy = wrap_policy(model, dist, **logp_options)
    ref_policy = wrap_policy(ref, dist, trainable=False, **logp_options) if ref else None
    optimizer = RecordingSGD([p for p in model.parameters() if p.requires_grad], lr=2.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    opt = Optimization(
        model=model,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        dist=dist,
        reference=ref_policy,
        ppo_epochs=config.algorithm.ppo_epochs,
        micro_batch_size=config.train.micro_batch_size,
        max_grad_norm=config.optim.max_grad_norm,
    )
    batch = global_batch()
    loss = bound_loss(config)
    metrics = update(loss, take(batch, rank_rows(dist)) if dist.active else batch, opt)
    return {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "grads": optimizer.seen}


def check_global_advantages(dist: Dist) -> None:
    batch = global_batch()
    rows = rank_rows(dist)
    for name, options in (("reinforce_pp", {}), ("reinforce_pp", {"group_baseline": True})):

        def estimate(r: torch.Tensor, g: torch.Tensor, name=name, options=options) -> torch.Tensor:  # noqa: ANN001
            return compute_advantages(name, r, g, **options)

        rewards = batch.rewards["total"]
        all_rewards, all_ids, mine = global_rows(dist, rewards[rows], batch.group_ids[rows])
        local = estimate(all_rewards, all_ids)[mine]
        whole = estimate(rewards, batch.group_ids)[rows]
        torch.testing.assert_close(local, whole, atol=1e-6, rtol=0)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    modes = os.environ.get("DIST_WORKER_MODES", "ddp,fsdp2").split(",")
    for mode in modes if distributed else ("none",):
        dist = setup(mode, "cpu")
        if distributed:
            check_global_advantages(dist)
        results = {}
        for name, opts in SCENARIOS.items():
            results[name] = run_scenario(dist, opts)
            if os.environ.get("DIST_WORKER_VERBOSE"):
                print(mode, name, "done", flush=True)
        if dist.is_main:
            torch.save(results, out / f"{mode}.pt")
    if distributed:
        gc.collect()  # DDP wrappers go before their process group
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
