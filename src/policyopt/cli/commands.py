"""quickstart, sft, train and eval sub-commands."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
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
    from policyopt.recipes import recipe_names  # the package's YAML files: no torch

    p = sub.add_parser("quickstart", help="the main job: SFT warm start, RL, held-out evaluation")
    p.add_argument(
        "recipe",
        nargs="?",
        default="grpo",
        help=f"a shipped recipe ({', '.join(recipe_names())}; default grpo) or a YAML path",
    )
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
    from policyopt.store import run_folder
    from policyopt.train.policy import refuse_incomplete_checkpoint

    # The SFT warm start loads the model without load_policy, which checks this for RL.
    refuse_incomplete_checkpoint(config.model.name_or_path, "model.name_or_path=")
    # Claimed before the SFT warm start: a folder of the user's files, or one another
    # process is running in, is refused before minutes of work (the trainer claims it again).
    run_folder.claim(config.train.output_dir)
    try:
        _, headline = run_quickstart(config, Console(), out)
    except BaseException:
        run_folder.release(config.train.output_dir, abandon=True)
        raise
    run_folder.release(config.train.output_dir)
    print(headline)
    return 0


def add_sft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised warm start on a task's expert solutions")
    add_config_file_arguments(p, "YAML config (its model, task and sft sections)")
    p.add_argument("--output-dir", required=True, help="where the fine-tuned model is saved")
    add_config_arguments(p)
    p.set_defaults(func=run_sft_command)


def add_config_file_arguments(p: argparse.ArgumentParser, help_text: str) -> None:
    """The config file as `train` and `quickstart` take it, positionally; `--config` too."""
    p.add_argument(
        "config_file",
        nargs="?",
        default=None,
        metavar="CONFIG",
        help=f"{help_text}, or a shipped recipe name",
    )
    p.add_argument("--config", default=None, help="the same, as an option")


def config_file_argument(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """(the config file given positionally or by --config, the overrides)."""
    positional, overrides = split_positional(args.config_file, args.overrides, None)
    if positional is not None and args.config is not None:
        raise ValueError(f"two config files: {positional} and --config {args.config}; give one")
    return positional or args.config, overrides


def run_sft_command(args: argparse.Namespace) -> int:
    config = file_config(*config_file_argument(args))
    if args.print_config:
        print(dump_config(config))
        return 0
    # After the config is read: its mistakes come back before torch's seconds of import.
    from policyopt.pipelines.quickstart import fine_tune
    from policyopt.store import run_folder
    from policyopt.train.policy import refuse_incomplete_checkpoint

    if config.sft.steps == 0:
        raise ValueError("sft.steps is 0: set it, e.g. sft.steps=1000")
    # fine_tune loads the model without load_policy, where this is checked for RL and eval.
    refuse_incomplete_checkpoint(config.model.name_or_path, "model.name_or_path=")
    # Claimed before the minutes of SFT: a folder of the user's files is refused now.
    out = run_folder.claim(args.output_dir, "--output-dir")
    try:
        model, tok, metrics = fine_tune(config)
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        (out / "sft_metrics.json").write_text(json.dumps(metrics))
    except BaseException:
        run_folder.release(out, abandon=True)  # a folder it made for nothing goes again
        raise
    run_folder.release(out)
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
            "runs SFT then RL, or `policyopt sft CONFIG --output-dir sft-model` and "
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
    add_config_file_arguments(p, "YAML config for the task and sampling")
    p.add_argument(
        "--model",
        required=True,
        help="a model name or path; a run folder (its newest checkpoint) or a checkpoint "
        "folder, evaluated on its own run's config unless a config is given",
    )
    p.add_argument("--samples", type=int, default=None, help="samples per problem for pass@k")
    p.add_argument(
        "--json-out",
        default=None,
        metavar="PATH",
        help=f"also write the JSON result to PATH ({OVERWRITTEN})",
    )
    p.add_argument(
        "--allow-run-code",
        action="store_true",
        help="obey a run's saved config where it names code to run (a reward module "
        "`module:function`, a verifiers taskset, model.trust_remote_code=true), its base: "
        "files included, although this user's policyopt did not write it: a run folder may "
        "come from someone else. Your own runs, config files and overrides need no flag",
    )
    add_config_arguments(p)
    p.set_defaults(func=run_eval)


def resolve_eval_model(name: str) -> tuple[str, Path | None, str]:
    """(what to load, the config of the run that trained it or None, what it is in words)
    for `eval --model`: a run folder means its newest checkpoint, which must be complete; a
    checkpoint with merged LoRA weights means those."""
    from policyopt.store.checkpoint import (
        CONFIG_FILE,
        incomplete_checkpoints,
        latest_checkpoint,
        step_of,
    )

    path = Path(name).expanduser()
    what = f"model {name}"
    if (path / "checkpoints").is_dir():
        found = latest_checkpoint(path)
        broken = incomplete_checkpoints(path)
        if found is None:
            raise FileNotFoundError(
                f"run folder {name!r} has no complete checkpoint"
                + (f" (incomplete: {', '.join(p.name for p in broken)})" if broken else "")
            )
        newer = [p for p in broken if step_of(p) > step_of(found)]
        if newer:
            # Evaluating an older step under the run's name would report the wrong model.
            raise FileNotFoundError(
                f"the newest checkpoint of run {name}, {newer[-1].name}, is incomplete (a save "
                "was interrupted, or a file is missing or truncated); the newest complete one "
                f"is {found.name}: give --model {found} to evaluate that one"
            )
        path = found
        what = f"run {name}, checkpoint step {step_of(found)} ({found})"
    else:
        from policyopt.train.policy import checkpoint_of, refuse_incomplete_checkpoint

        # A checkpoint given directly (or its merged/ folder) is held to the same test as
        # the one a run folder resolves to: a partial save is not evaluated.
        refuse_incomplete_checkpoint(name, "--model ")
        if checkpoint_of(name) == path:
            what = f"checkpoint {path}"
    if not path.is_dir():
        return name, None, what
    model = path / "merged" if (path / "merged").is_dir() else path
    if model != path:
        what += ", its merged LoRA weights"
    for candidate in (path / CONFIG_FILE, path.parent / CONFIG_FILE):
        if candidate.is_file():
            return str(model), candidate, what
    return str(model), None, what


def run_eval(args: argparse.Namespace) -> int:
    from policyopt.store import provenance

    model_path, run_config, what = resolve_eval_model(args.model)
    config_path, overrides = config_file_argument(args)
    guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if config_path is None and run_config is not None:
        config_path = str(run_config)
        if not args.allow_run_code and not provenance.signed_here(run_config):
            guard = foreign_run_config(run_config, overrides)
    # Everything after this point, config loading included, imports code under the guard.
    with guard:
        return evaluate(args, config_path, overrides, model_path, run_config, what)


def evaluate(
    args: argparse.Namespace,
    config_path: str | None,
    overrides: list[str],
    model_path: str,
    run_config: Path | None,
    what: str,
) -> int:
    """The rest of `eval`, once what to evaluate and with which config is settled."""
    config = file_config(config_path, [*overrides, f"model.name_or_path={model_path}"])
    if args.print_config:
        print(dump_config(config))
        return 0
    import torch

    from policyopt.models.precision import set_precision
    from policyopt.models.threads import apply_num_threads
    from policyopt.train.held_out import eval_rows, evaluate_run
    from policyopt.train.parts import build_parts
    from policyopt.train.policy import load_policy
    from policyopt.train.prompts import check_chat_template, check_positions

    # The same assembly as training: every part checked and bound (engine options, remote
    # reward workers, a ranking policy for a ranking task), then the run's evaluation.
    parts = build_parts(config)
    model, tok = load_policy(config.model, parts.task)
    # Limits before work, as train checks them: a chat template the tokenizer lacks is one
    # line here, not transformers' error once evaluation has started.
    check_chat_template(config, tok)
    set_precision(model, config.model.precision)
    rows = eval_rows(parts.task, parts.evaluation.size)
    check_positions(model, tok, parts.task, "eval", rows, config)
    apply_num_threads(config.train.num_threads, model)
    engine = parts.make_engine(model, tok)
    # What is evaluated, once it loaded, on stderr (stdout carries the JSON result only).
    console = Console(stderr=True)
    source = f" with the run's config {run_config}" if config_path == str(run_config) else ""
    console.print(
        f"evaluating {what} on {config.task.name}{source} ...",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    try:
        with torch.no_grad():
            result = evaluate_run(
                parts.evaluation,
                parts.task,
                tok,
                engine,
                rows=rows,
                samples=args.samples,
                console=console,
                reward_fn=parts.reward,
            )
    finally:
        parts.reward.close()
    text = json.dumps(result, indent=2)
    if args.json_out:
        write_output(args.json_out, text)
    print(text)
    return 0


# How each option that names an output file says what happens to a file already there.
OVERWRITTEN = "overwritten if it exists; written whole or not at all"


def write_output(path: str | Path, text: str) -> Path:
    """Write `text` to the file the user named as an output (`--json-out`, `--write`).

    The file is theirs to overwrite, as with `-o`, and each option's help says so. It is
    written to a temporary file beside it and renamed over it, so a crash or a full disk
    leaves the old file whole, never half a new one."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())  # on disk before the rename makes it the file
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


# What `eval` tells a user whose run folder's config names code.
RUN_CODE_ADVICE = (
    "pass --allow-run-code if you trust the run, or give your own config (or override the key)"
)


@contextlib.contextmanager
def foreign_run_config(run_config: Path, overrides: list[str]) -> Iterator[None]:
    """Within: `run_config` came from elsewhere (this user's policyopt did not sign it), so
    the code it names is not run unless the user's overrides name it
    (`core/user_code.py`). The merged config is scanned first, so the refusal comes before
    any work and names the key."""
    from policyopt.config.load import parse_override
    from policyopt.core import user_code

    given = dict(parse_override(o) for o in overrides)
    with user_code.foreign_config(str(run_config), RUN_CODE_ADVICE, given):
        refuse_run_code(run_config)
        yield


def refuse_run_code(run_config: Path) -> None:
    """Raise if the run's config, with its `base:` chain merged underneath as `file_config`
    merges it, names code that the gate in force refuses (`user_code.config_code`). A run
    folder may come from someone else, and importing a module it names would run that
    module (the working folder is on sys.path)."""
    from policyopt.core import user_code
    from policyopt.recipes import recipe_dict

    for key, name, what in user_code.config_code(recipe_dict(str(run_config))):
        user_code.allow_user_code(what, name, key)
