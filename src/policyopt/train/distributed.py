"""Data-parallel training over torch.distributed (torchrun): the process group, each rank's
share of a step's prompts, the all-reduces that make the loss global, and the wrapped policy.

One step's global batch is `rollout.prompts_per_step` prompts; rank r of W samples the
prompts r·P/W .. (r+1)·P/W − 1 of it, with all G responses of each, so a group never spans
ranks and every per-group statistic (GRPO's mean and std, RLOO's leave-one-out mean) is
computed where its group lives. What is global is made global:

- loss normalisers (N_tok, N_seq of core.aggregation): all-reduced sums over the ranks;
- rewards for the advantage estimators that take only (rewards, group_ids): all-gathered,
  so batch statistics (REINFORCE++'s batch mean and std) are those of the global batch;
- gradients: summed over the ranks (not averaged): every rank's loss is already its share
  of the global loss Σ_ranks ℓ_r, so Σ_r ∇ℓ_r is the single-process gradient.

The policy is wrapped once: `PolicyForward` (log-probs of response tokens) under DDP, or
with every decoder layer and the root under FSDP2 (`fully_shard`), so each training
forward goes through the wrapper's hooks. Sampling (and evaluation) runs on the unwrapped
model; under FSDP2 inside `full_weights`, which all-gathers every layer once so that ranks
can generate different numbers of tokens without matching collectives.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from policyopt.models.logprobs import response_logprobs, trunk_of
from policyopt.models.precision import mixed_precision

PARALLEL_MODES = ("auto", "none", "ddp", "fsdp2")

# Keys of step metrics that add up over ranks (the rest are averaged, or max / min).
SUMMED_METRICS = (
    "leaves",
    "generated_tokens",
    "tokens_per_s",
    "unparseable",
    "filter/kept_groups",
    "filter/sampled_groups",
)


@dataclass(frozen=True)
class Dist:
    """This process's place in the data-parallel group (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world: int = 1
    mode: str = "none"  # none | ddp | fsdp2
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Whether collectives run (a process group exists and the policy is wrapped)."""
        return self.mode != "none"

    # ------------------------------------------------------------ collectives
    def sum(self, *values: float) -> list[float]:
        """Σ over ranks of each value (float64, so integer counts stay exact)."""
        if not self.active:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64)
        tdist.all_reduce(t)
        return t.tolist()

    def max_int(self, value: int) -> int:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return int(t)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (picklable objects)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        tdist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            tdist.barrier()


def resolve_mode(parallel: str, world: int) -> str:
    """`train.parallel` with "auto" resolved: ddp under torchrun with 2+ processes, else none."""
    if parallel not in PARALLEL_MODES:
        raise ValueError(
            f"train.parallel must be one of {', '.join(PARALLEL_MODES)}; got {parallel!r}"
        )
    if parallel == "auto":
        return "ddp" if world > 1 else "none"
    if parallel == "none" and world > 1:
        raise ValueError(
            f"train.parallel=none but WORLD_SIZE={world}: every process would train alone; "
            "use ddp or fsdp2 (or auto) under torchrun"
        )
    return parallel


def setup(parallel: str, device: str, timeout_s: float = 1800.0) -> Dist:
    """Join the process group that torchrun describes in the environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT): gloo on CPU, nccl on CUDA. Without torchrun and with
    `parallel` none or auto, nothing happens; ddp or fsdp2 alone runs a group of one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    mode = resolve_mode(parallel, world)
    if mode == "none":
        return Dist()
    if not tdist.is_initialized():
        if "MASTER_ADDR" not in os.environ:  # a group of one outside torchrun
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(local_rank)
        tdist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return Dist(tdist.get_rank(), tdist.get_world_size(), mode, local_rank)


def rank_device(device: str, dist: Dist) -> str:
    """One accelerator per process: cuda -> cuda:LOCAL_RANK under torchrun."""
    if dist.active and device == "cuda":
        return f"cuda:{dist.local_rank}"
    return device


def share(prompts_per_step: int, dist: Dist) -> int:
    """Prompts this rank samples per step: P / W (whole groups per rank)."""
    if prompts_per_step % dist.world:
        raise ValueError(
            f"rollout.prompts_per_step={prompts_per_step} is not divisible by the "
            f"{dist.world} data-parallel processes: every rank samples whole groups"
        )
    return prompts_per_step // dist.world


def rank_slice(indices: list[int], dist: Dist) -> list[int]:
    """This rank's contiguous share of one round's global prompt indices."""
    k = share(len(indices), dist)
    return indices[dist.rank * k : (dist.rank + 1) * k]


# ---------------------------------------------------------------- the wrapped policy
class PolicyForward(nn.Module):
    """forward(ids, mask, width) = response log-probs [B, width] of `policy` (one module, so
    that DDP's and FSDP2's hooks see every training forward: the log-prob path calls the
    trunk and the LM head separately, never the causal LM's own forward)."""

    def __init__(self, policy: nn.Module, temperature: float, chunk_size: int) -> None:
        super().__init__()
        self.policy = policy
        self.temperature = temperature
        self.chunk_size = chunk_size
        # FSDP2 averages gradients over the W ranks (its divide factor of 1 needs a
        # PREMUL_SUM reduction that gloo lacks): scaling d loss / d logp by W makes the
        # average the sum. Exact for W a power of two; otherwise within a rounding error.
        self.grad_scale = 1.0
        # FSDP2: one trunk call per forward on every rank (a shared-prompt pass calls each
        # layer twice, and each call is an all-gather that the other ranks must match).
        self.share_prompts = True

    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        width: int,
        allowed_bits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`allowed_bits` [B, width, ceil(V / 32)]: the grammar's allowed tokens, packed
        (`Rollouts.allowed_bits`). Under bf16-mixed the forward runs under autocast, the
        log-probs come out float32 (`models.precision`)."""
        with mixed_precision(self.policy):
            logp = response_logprobs(
                self.policy,
                ids,
                mask,
                width,
                temperature=self.temperature,
                chunk_size=self.chunk_size,
                share_prompts=self.share_prompts,
                allowed_bits=allowed_bits,
            ).logp
        if self.grad_scale != 1.0 and logp.requires_grad:
            logp.register_hook(lambda g: g * self.grad_scale)
        return logp


def wrap_policy(
    model: nn.Module, dist: Dist, *, temperature: float, chunk_size: int, trainable: bool = True
) -> nn.Module:
    """`PolicyForward(model)` as the data-parallel mode asks: plain, DDP, or FSDP2 (each decoder
    layer sharded, the root holding embeddings, final norm and head). Under FSDP2 the
    parameters of `model` become sharded DTensors in place: build the optimizer after this.
    Gradients are summed over ranks (module docstring)."""
    forward = PolicyForward(model, temperature, chunk_size)
    if dist.mode == "none":
        return forward
    if dist.mode == "ddp":
        if not trainable:
            return forward  # no gradients to synchronise; forwards need no collectives
        device_ids = [dist.local_rank] if next(model.parameters()).is_cuda else None
        ddp = nn.parallel.DistributedDataParallel(
            forward, device_ids=device_ids, broadcast_buffers=False
        )
        ddp.register_comm_hook(None, _sum_hook)
        return ddp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if hasattr(model, "peft_config"):
        raise ValueError("train.parallel=fsdp2 does not support LoRA adapters; use ddp")
    layers = getattr(trunk_of(model), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"fsdp2: cannot find the decoder layers of {type(model).__name__} "
            "(expected a ModuleList `layers` in its trunk)"
        )
    device_type = "cuda" if next(model.parameters()).is_cuda else "cpu"
    mesh = init_device_mesh(device_type, (dist.world,))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(forward, mesh=mesh)
    forward.grad_scale = float(dist.world)  # sum, do not average, the ranks' gradients
    forward.share_prompts = False
    return forward


def _sum_hook(_state, bucket):  # noqa: ANN001, ANN202 - DDP checks the real annotations
    """DDP communication hook: all-reduce SUM (DDP's default divides by the world size)."""
    fut = tdist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _fsdp_modules(root: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


@contextmanager
def full_weights(wrapped: nn.Module | None) -> Iterator[None]:
    """Under FSDP2: every layer all-gathered for the duration (sampling, evaluation, reward
    shapers that run the model), without per-forward collectives, so ranks may run different
    numbers of forwards. All ranks must enter and leave together. Otherwise a no-op."""
    mods = _fsdp_modules(wrapped) if wrapped is not None and _is_fsdp(wrapped) else []
    if not mods:
        yield
        return
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    # The root's lazy init (normally on its first forward) must precede any layer's forward,
    # else a layer called first would make itself a root.
    _get_module_fsdp_state(wrapped)._lazy_init()
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True)


def _is_fsdp(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def grad_sync(wrapped: nn.Module | None, last: bool) -> Any:
    """Context for one micro-batch's backward: synchronise gradients only on the last one
    (DDP's no_sync; FSDP2 keeps unsharded gradients until then)."""
    if isinstance(wrapped, nn.parallel.DistributedDataParallel) and not last:
        return wrapped.no_sync()
    if wrapped is not None and _is_fsdp(wrapped):
        wrapped.set_requires_gradient_sync(last)
    return nullcontext()


def to_local_float(x: torch.Tensor) -> float:
    """float() of a tensor that may be a DTensor (FSDP2's total grad norm)."""
    full = getattr(x, "full_tensor", None)
    return float(full() if callable(full) else x)


def local_state_mb(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """MiB this rank holds of parameters, gradients and optimizer state: its local shards
    under FSDP2, whole tensors otherwise. Gradients are counted at their parameters' local
    size (what the step holds after backward; they are freed after it)."""

    def mb(tensors: list[torch.Tensor]) -> float:
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local) / 2**20

    params = list(model.parameters())
    state = [
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()
    ]
    return {
        "params_mb": mb(params),
        "grads_mb": mb([p for p in params if p.requires_grad]),
        "optimizer_mb": mb(state),
    }


# ---------------------------------------------------------------- micro-batch passes
@dataclass
class Padding:
    """What the forwards of micro-batch passes computed: the positions of their
    [rows, prompt + response] tensors (after `batch.trim`), and how many were padding."""

    positions: int = 0
    padded: int = 0

    def add(self, attention_mask: torch.Tensor) -> None:
        self.positions += attention_mask.numel()
        self.padded += int((attention_mask == 0).sum())

    def fraction(self, dist: Dist) -> float:
        """Padding positions / all positions, over every rank's passes (a collective)."""
        positions, padded = dist.sum(self.positions, self.padded)
        return padded / positions if positions else 0.0


class MicroBatches:
    """The micro-batch passes over a minibatch's `rows`, and what they add up to.

    Iterating yields each pass's rows; `backward(loss, metrics, tokens)` then runs its
    backward and pools its metrics. Under data parallelism each DDP or FSDP2 pass is a
    collective, so every rank runs as many passes as the busiest one: a rank's extra passes
    replay its last micro-batch with loss × 0 (a replay counts for nothing), and gradients
    are synchronised on the last pass only (nanoGPT's one line, as a context around it).
    `result()` gives the pooled metrics and the summed loss over all ranks.

    `lengths` [N] (a length per row of the batch that `rows` index): rows that make more
    than one micro-batch are taken longest first, so that each micro-batch, trimmed, is
    padded to its own longest row rather than the minibatch's. Every loss normaliser is the
    minibatch's (core.aggregation), so the summed loss and gradient are those of any split,
    up to the order of float sums. `padding` counts what each of this rank's own passes
    computes (`computed`)."""

    def __init__(
        self,
        dist: Dist,
        rows: torch.Tensor,
        size: int,
        wrapped: nn.Module | None = None,
        *,
        lengths: torch.Tensor | None = None,
        padding: Padding | None = None,
    ) -> None:
        if lengths is not None and len(rows) > size:
            rows = rows[torch.sort(lengths[rows], descending=True, stable=True).indices]
        self.dist, self.rows, self.wrapped = dist, rows, wrapped
        self.slices = [slice(i, min(i + size, len(rows))) for i in range(0, len(rows), size)]
        self.passes = dist.max_int(len(self.slices))
        self.counts = True  # whether the current pass is one of this rank's own
        self.pool = MetricPool()
        self.loss_sum = 0.0
        self.padding = padding

    def computed(self, attention_mask: torch.Tensor) -> None:
        """The current pass ran its forward on `attention_mask` [rows, positions]."""
        if self.counts and self.padding is not None:
            self.padding.add(attention_mask)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for k in range(self.passes):
            self.counts = k < len(self.slices)
            with grad_sync(self.wrapped, last=k == self.passes - 1):
                yield self.rows[self.slices[min(k, len(self.slices) - 1)]]

    def backward(self, loss: torch.Tensor, metrics: dict[str, float], tokens: float) -> None:
        if not self.counts:
            loss = loss * 0.0  # a replay that keeps this rank in step with the collectives
        loss.backward()
        if self.counts:
            self.pool.add(metrics, tokens)
            self.loss_sum += float(loss.detach())  # micro losses sum to the minibatch loss

    def result(self) -> tuple[dict[str, float], float]:
        """(metrics pooled over every rank's passes, with `loss` the global loss; tokens)."""
        pooled = self.pool.merged(self.dist)
        out = pooled.result()
        (out["loss"],) = self.dist.sum(self.loss_sum)  # ranks' losses sum to the global one
        return out, pooled.tokens


class MetricPool:
    """Pools per-part loss metrics into the whole's: `*_min` / `*_max` by min / max, the
    others (fractions and means over tokens) weighted by each part's token count."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.extremes: dict[str, float] = {}
        self.tokens = 0.0

    def add(self, metrics: dict[str, float], tokens: float) -> None:
        for k, v in metrics.items():
            if k.endswith("_min"):
                self.extremes[k] = min(self.extremes.get(k, float("inf")), float(v))
            elif k.endswith("_max"):
                self.extremes[k] = max(self.extremes.get(k, float("-inf")), float(v))
            else:
                self.sums[k] += float(v) * tokens
        self.tokens += tokens

    def merged(self, dist: Dist) -> MetricPool:
        """The pool of every rank's parts (itself without data parallelism)."""
        if not dist.active:
            return self
        whole = MetricPool()
        for sums, extremes, tokens in dist.gather((dict(self.sums), self.extremes, self.tokens)):
            for k, v in sums.items():
                whole.sums[k] += v
            for k, v in extremes.items():
                pick = min if k.endswith("_min") else max
                whole.extremes[k] = pick(whole.extremes.get(k, v), v)
            whole.tokens += tokens
        return whole

    def result(self) -> dict[str, float]:
        out = {k: v / max(self.tokens, 1.0) for k, v in self.sums.items()}
        out.update(self.extremes)
        return out


# ---------------------------------------------------------------- global statistics
def global_rows(
    dist: Dist, rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, slice]:
    """The GLOBAL batch's rewards and group ids, and which of its rows are this rank's: an
    advantage estimator run on them sees batch statistics of every rank's rows.

    A rank's ids are made distinct from other ranks' (id·W + r), since groups never span
    ranks. Without data parallelism: the arguments and every row."""
    if not dist.active:
        return rewards, group_ids, slice(None)
    parts = dist.gather((rewards, group_ids))
    all_rewards = torch.cat([r for r, _ in parts])
    all_ids = torch.cat([g.long() * dist.world + r for r, (_, g) in enumerate(parts)])
    start = sum(len(r) for r, _ in parts[: dist.rank])
    return all_rewards, all_ids, slice(start, start + len(rewards))


def reduce_metrics(dist: Dist, metrics: dict[str, float]) -> dict[str, float]:
    """One step's metrics over all ranks: counts summed (SUMMED_METRICS), `*_max`/`time/*`
    by max, `*_min` by min, the rest averaged (ranks hold equal shares of the batch)."""
    if not dist.active:
        return metrics
    parts = dist.gather(metrics)
    keys = sorted({k for p in parts for k in p})
    out: dict[str, float] = {}
    for k in keys:
        vals = [float(p[k]) for p in parts if k in p]
        if k in SUMMED_METRICS:
            out[k] = sum(vals)
        elif k.endswith("_max") or k.endswith("/max") or k.startswith("time/"):
            out[k] = max(vals)
        elif k.endswith("_min") or k.endswith("/min"):
            out[k] = min(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
