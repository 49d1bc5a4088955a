"""quickstart, sft, train and eval sub-commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from policyopt.recipes import recipe_config
from policyopt.trainer.config import Config, dump_config, load_config


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
    from policyopt.recipes.pipeline import run_pipeline

    recipe, overrides = split_positional(args.recipe, args.overrides, "grpo")
    out = args.output_dir or f"runs/quickstart-{Path(recipe).stem}"
    config = recipe_config(recipe, overrides, out, args.seed)
    if args.print_config:
        print(dump_config(config))
        return 0
    if config.task.name == "dmrl_skill":
        return run_dmrl_quickstart(config, out)
    summary = run_pipeline(config, Console())
    if "final_ndcg@10" in summary:
        print(ranking_line(summary, out))
        return 0
    gain = summary["final_accuracy"] - summary["initial_accuracy"]
    before, after = summary["initial_eval"]["eval/reward"], summary["final_eval"]["eval/reward"]
    print(
        f"held-out greedy accuracy {summary['initial_accuracy']:.3f} -> "
        f"{summary['final_accuracy']:.3f} ({gain:+.3f}), mean reward {before:.3f} -> "
        f"{after:.3f} ({after - before:+.3f}); summary: {out}/summary.json"
    )
    return 0


def run_dmrl_quickstart(config, out: str) -> int:  # noqa: ANN001
    """DMRL's pipeline (LRP, warm start, DRPO, long-term value of the deployed config)."""
    from policyopt.recipes.dmrl_pipeline import run_dmrl_pipeline

    s = run_dmrl_pipeline(config, Console())
    print(
        f"true 7-day value per user of the deployed configuration "
        f"{s['initial_long_term_value']:.4f} -> {s['final_long_term_value']:.4f} "
        f"({s['relative_gain'] * 100:+.2f}%); held-out 7-day effect Spearman: LRP "
        f"{s['lrp_spearman']:.3f}, surrogate index {s['surrogate_spearman']:.3f}; "
        f"summary: {out}/summary.json"
    )
    return 0


def ranking_line(summary: dict, out: str) -> str:
    """Held-out NDCG@10 before/after RL and the references, for a ranking run."""
    before, after = summary["initial_ndcg@10"], summary["final_ndcg@10"]
    refs = [
        f"{name} {summary[key]:.3f}"
        for name, key in (
            ("oracle", "oracle_ndcg@10"),
            ("LambdaRank", "lambdarank_ndcg@10"),
            ("listwise softmax (full labels)", "listwise_softmax_ndcg@10"),
        )
        if summary.get(key) is not None
    ]
    return (
        f"held-out NDCG@10 {before:.3f} -> {after:.3f} ({after - before:+.3f}); "
        f"{'; '.join(refs)}; summary: {out}/summary.json"
    )


def add_sft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised warm start on a task's expert solutions")
    p.add_argument("--config", default=None, help="YAML config (its model, task and sft sections)")
    p.add_argument("--output-dir", required=True, help="where the fine-tuned model is saved")
    add_config_arguments(p)
    p.set_defaults(func=run_sft_command)


def run_sft_command(args: argparse.Namespace) -> int:
    from policyopt.recipes.pipeline import fine_tune

    config = file_config(args.config, args.overrides)
    if args.print_config:
        print(dump_config(config))
        return 0
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
    add_config_arguments(p)
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from policyopt.trainer.trainer import Trainer

    config = file_config(*split_positional(args.config, args.overrides, None))
    if args.print_config:
        print(dump_config(config))
        return 0
    trainer = Trainer(config)
    try:
        metrics = trainer.train()
    finally:
        trainer.close()
    if trainer.dist.is_main:
        print(json.dumps({k: v for k, v in metrics.items() if not k.startswith("time/")}))
    return 0


def add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="held-out greedy accuracy and pass@k of a model")
    p.add_argument("--model", required=True, help="model path or name (a checkpoint folder works)")
    p.add_argument("--config", default=None, help="YAML config for the task and sampling")
    p.add_argument("--samples", type=int, default=None, help="samples per problem for pass@k")
    p.add_argument("--json-out", default=None)
    add_config_arguments(p)
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from policyopt.models.loading import load_model
    from policyopt.rollout.base import ENGINES
    from policyopt.tasks.base import get_task
    from policyopt.trainer.evaluate import eval_rows, evaluate

    config = file_config(args.config, [*args.overrides, f"model.name_or_path={args.model}"])
    if args.print_config:
        print(dump_config(config))
        return 0
    model, tok = load_model(config.model.name_or_path, dtype=config.model.dtype)
    task = get_task(config.task.name, **config.task.options)
    engine = ENGINES.get(config.rollout.engine)(model, tok, batch_size=config.rollout.batch_size)
    result = evaluate(
        task=task,
        rows=eval_rows(task, config.eval.size),
        tokenizer=tok,
        engine=engine,
        max_new_tokens=config.eval.max_new_tokens or config.rollout.max_new_tokens,
        samples=config.eval.samples if args.samples is None else args.samples,
        temperature=config.eval.temperature,
        chat=config.model.chat_template,
        correct_threshold=config.reward.correct_threshold,
    )
    text = json.dumps(result, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text)
    print(text)
    return 0
