"""quickstart, sft, train and eval sub-commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from policyopt.config.load import Config, dump_config, load_config
from policyopt.recipes import recipe_config


def split_positional(
    first: str | None, overrides: list[str], default: str | None
) -> tuple[str | None, list[str]]:
    """argparse gives a leading KEY=VALUE to the optional positional: move it back."""
    if first is not None and "=" in first:
        return default, [first, *overrides]
    return first, list(overrides)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. optim.lr=1e-5"
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def add_quickstart(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="the main job: SFT warm start, RL, held-out evaluation")
    p.add_argument("recipe", nargs="?", default="grpo", help="a shipped recipe name or a YAML path")
    p.add_argument("--output-dir", default=None, help="default: runs/quickstart-RECIPE")
    p.add_argument("--seed", type=int, default=None)
    add_config_arguments(p)
    p.set_defaults(func=run_quickstart)


def file_config(path: str | None, overrides: list[str]) -> Config:
    """The config of a YAML file (its `base:` recipe merged underneath, as for quickstart) or
    of a shipped recipe name, then the overrides; without a file, the defaults."""
    from policyopt.recipes import recipe_dict

    return load_config(None, overrides, base=recipe_dict(path) if path is not None else None)


def run_quickstart(args: argparse.Namespace) -> int:
    recipe, overrides = split_positional(args.recipe, args.overrides, "grpo")
    out = args.output_dir or f"runs/quickstart-{Path(recipe).stem}"
    config = recipe_config(recipe, overrides, out, args.seed)
    if args.print_config:
        print(dump_config(config))
        return 0
    from policyopt.pipelines import run_quickstart  # after the config (run_sft_command)

    _, headline = run_quickstart(config, Console(), out)
    print(headline)
    return 0


def add_sft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised warm start on a task's expert solutions")
    p.add_argument("--config", default=None, help="YAML config (its model, task and sft sections)")
    p.add_argument("--output-dir", required=True, help="where the fine-tuned model is saved")
    add_config_arguments(p)
    p.set_defaults(func=run_sft_command)


def run_sft_command(args: argparse.Namespace) -> int:
    config = file_config(args.config, args.overrides)
    if args.print_config:
        print(dump_config(config))
        return 0
    # After the config is read: its mistakes come back before torch's seconds of import.
    from policyopt.pipelines.quickstart import fine_tune

    if config.sft.steps == 0:
        raise ValueError("sft.steps is 0: set it, e.g. sft.steps=1000")
    model, tok, metrics = fine_tune(config)
    out = Path(args.output_dir)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "sft_metrics.json").write_text(json.dumps(metrics))
    print(json.dumps(metrics))
    return 0


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="RL training from a YAML config")
    p.add_argument(
        "config",
        nargs="?",
        default=None,
        help="YAML config (may start from a recipe with `base:`) or a shipped recipe name; "
        "omitted: defaults",
    )
    p.add_argument("--output-dir", default=None, help="run folder (train.output_dir)")
    add_config_arguments(p)
    p.set_defaults(func=run_train)


def cannot_learn_warning(config: Config) -> str | None:
    """A warning for a setup that starts RL where it cannot learn: the embedded model is
    untrained (random weights) and `train` does no SFT."""
    import policyopt.tasks  # noqa: F401  (registers the shipped tasks)
    from policyopt.tasks.base import task_class

    if config.model.name_or_path == "tiny" and not task_class(config.task.name).random_start:
        return (
            "warning: model 'tiny' is the embedded model, untrained (random weights); RL from "
            "it earns almost no reward. Warm start it first: `policyopt quickstart CONFIG` "
            "runs SFT then RL, or `policyopt sft --config CONFIG --output-dir sft-model` and "
            "then train with model.name_or_path=sft-model (SFT needs the task's expert "
            "solutions: task.options.solution_column for an hf_dataset)."
        )
    return None


def run_train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.output_dir is not None:
        overrides.append(f"train.output_dir={args.output_dir}")
    config = file_config(*split_positional(args.config, overrides, None))
    if args.print_config:
        print(dump_config(config))
        return 0
    from policyopt.train.trainer import Trainer  # after the config (run_sft_command)

    warning = cannot_learn_warning(config)
    if warning:
        Console(stderr=True).print(warning, markup=False, highlight=False)
    trainer = Trainer(config)
    try:
        metrics = trainer.train()
        # Before `close`, which under torchrun drops the training state with the process group.
        summary = train_summary(trainer, metrics) if trainer.dist.is_main else None
    finally:
        trainer.close()
    if summary is not None:
        print(summary)
    return 0


def train_summary(trainer: Any, metrics: dict[str, float]) -> str:
    """What a finished `train` says: steps, the last step's reward and accuracy, where the
    checkpoint and logs are, and how to evaluate it."""
    from policyopt.store.checkpoint import latest_checkpoint

    out = trainer.output_dir
    ckpt = latest_checkpoint(out)
    lines = [f"trained {trainer.step} steps of {trainer.config.algorithm.name}"]
    if "reward/total/mean" in metrics:
        lines[0] += f"; last step: mean reward {metrics['reward/total/mean']:.3f}"
        if "accuracy" in metrics:
            lines[0] += f", accuracy {metrics['accuracy']:.3f}"
    if ckpt is not None:
        model = ckpt / "merged" if (ckpt / "merged").is_dir() else ckpt
        lines.append(f"checkpoint: {model}")
        lines.append(f"evaluate it: policyopt eval --model {out}")
    lines.append(f"metrics: {out / 'metrics.jsonl'}; config: {out / 'config.yaml'}")
    return "\n".join(lines)


def add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="held-out greedy accuracy and pass@k of a model")
    p.add_argument(
        "--model",
        required=True,
        help="a model name or path; a run folder (its latest complete checkpoint) or a "
        "checkpoint folder, evaluated on its own run's config unless --config is given",
    )
    p.add_argument("--config", default=None, help="YAML config for the task and sampling")
    p.add_argument("--samples", type=int, default=None, help="samples per problem for pass@k")
    p.add_argument("--json-out", default=None)
    add_config_arguments(p)
    p.set_defaults(func=run_eval)


def resolve_eval_model(name: str) -> tuple[str, Path | None]:
    """(what to load, the config of the run that trained it or None) for `eval --model`: a
    run folder means its latest complete checkpoint; a checkpoint with merged LoRA weights
    means those."""
    from policyopt.store.checkpoint import (
        CONFIG_FILE,
        incomplete_checkpoints,
        latest_checkpoint,
    )

    path = Path(name).expanduser()
    if (path / "checkpoints").is_dir():
        found = latest_checkpoint(path)
        if found is None:
            broken = [p.name for p in incomplete_checkpoints(path)]
            raise FileNotFoundError(
                f"run folder {name!r} has no complete checkpoint"
                + (f" (incomplete: {', '.join(broken)})" if broken else "")
            )
        path = found
    if not path.is_dir():
        return name, None
    model = path / "merged" if (path / "merged").is_dir() else path
    for candidate in (path / CONFIG_FILE, path.parent / CONFIG_FILE):
        if candidate.is_file():
            return str(model), candidate
    return str(model), None


def run_eval(args: argparse.Namespace) -> int:
    import torch

    from policyopt.models.threads import apply_num_threads
    from policyopt.train.held_out import evaluate_run
    from policyopt.train.parts import build_parts
    from policyopt.train.policy import load_policy

    model_path, run_config = resolve_eval_model(args.model)
    config_path = args.config
    console = Console(stderr=True)
    if config_path is None and run_config is not None:
        config_path = str(run_config)
        console.print(f"task, rewards and sampling from the run's config {run_config}")
    config = file_config(config_path, [*args.overrides, f"model.name_or_path={model_path}"])
    if args.print_config:
        print(dump_config(config))
        return 0
    # The same assembly as training: every part checked and bound (engine options, remote
    # reward workers, a ranking policy for a ranking task), then the run's evaluation.
    parts = build_parts(config)
    model, tok = load_policy(config.model, parts.task)
    apply_num_threads(config.train.num_threads, model)
    engine = parts.make_engine(model, tok)
    console.print(f"evaluating {model_path} on {config.task.name} ...")
    try:
        with torch.no_grad():
            result = evaluate_run(
                parts.evaluation,
                parts.task,
                tok,
                engine,
                samples=args.samples,
                console=console,
                reward_fn=parts.reward,
            )
    finally:
        parts.reward.close()
    text = json.dumps(result, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text)
    print(text)
    return 0
