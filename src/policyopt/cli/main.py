"""`policyopt`: quickstart, sft, train, eval, compare, bench."""

from __future__ import annotations

import argparse
import os
import sys

from policyopt.trainer.config import ConfigError
from policyopt.trainer.update import NonFiniteUpdateError

USER_ERRORS = (
    ConfigError,
    KeyError,
    ValueError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars say what is happening
    parser = build_parser()
    # KEY=VALUE overrides may follow options (argparse would not resume a positional there).
    args, unknown = parser.parse_known_args(argv)
    stray = [u for u in unknown if u.startswith("-") or "=" not in u]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if unknown:
        args.overrides = [*getattr(args, "overrides", []), *unknown]
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as err:
        # A user's mistake (a config, a path, a value): the message says what and where; a
        # traceback would only bury it. POLICYOPT_TRACEBACK=1 shows it anyway.
        if os.environ.get("POLICYOPT_TRACEBACK"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"policyopt {args.command}: error: {message}", file=sys.stderr)
        return 2
    except NonFiniteUpdateError as err:
        if os.environ.get("POLICYOPT_TRACEBACK"):
            raise
        print(f"policyopt {args.command}: {err}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    from policyopt.cli import bench, commands, compare, config_reference, data

    parser = argparse.ArgumentParser(
        prog="policyopt",
        description="RL post-training with GRPO, DAPO, Dr. GRPO, GSPO, RLOO and newer methods.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_quickstart(sub)
    commands.add_sft(sub)
    commands.add_train(sub)
    commands.add_eval(sub)
    compare.add_compare(sub)
    bench.add_bench(sub)
    data.add_data(sub)
    config_reference.add_config_reference(sub)
    # The study runner runs its runs through this entry in-process (cli/study.py).
    parser.set_defaults(cli_main=main)
    return parser


if __name__ == "__main__":
    sys.exit(main())
