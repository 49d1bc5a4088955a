"""`policyopt`: quickstart, sft, train, eval, compare, bench."""

from __future__ import annotations

import argparse
import errno
import os
import sys

# Nothing heavy at import time (torch, transformers): `policyopt --help` and config
# errors come back in a fraction of a second; each command imports what it needs.
from policyopt.config.load import ConfigError

USER_ERRORS = (
    ConfigError,
    KeyError,
    ValueError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    ImportError,  # a missing optional package: the message says what to install
    SyntaxError,  # in a user's reward module (its file and line are in the message)
)


def main(argv: list[str] | None = None) -> int:
    # As `python -m` and `python -c` do: modules in the working folder (a reward module
    # `my_rewards.py` beside the config) import by name.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
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
    # Our own progress bars say what is happening: no Hub or transformers bars (read when
    # transformers is imported, so importing it here, seconds before a config error, is not
    # needed). A user's own setting stays.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        from transformers.utils import logging as hf_logging  # read before: set it directly

        hf_logging.disable_progress_bar()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as err:
        # Ctrl-C: one line. The trainer's RunInterrupted says at which step it stopped and
        # where the same command resumes; anywhere else (loading, evaluation) nothing that a
        # rerun needs was lost. 130: the shell's code for a SIGINT.
        if os.environ.get("POLICYOPT_TRACEBACK"):
            raise
        detail = str(err) or "interrupted; the same command starts it again"
        print(f"policyopt {args.command}: {detail}", file=sys.stderr)
        return 130
    except Exception as err:
        # Only a module that was imported can have raised its errors: looked up, not
        # imported, so that a config error comes back without torch's import.
        reward_error = _loaded("policyopt.rewards.functions", "RewardFunctionError")
        nonfinite_error = _loaded("policyopt.train.update", "NonFiniteUpdateError")
        disk_full_error = _loaded("policyopt.store.checkpoint", "DiskFullError")
        # A user's mistake (a config, a path, a value, a reward function): the message says
        # what and where, in one paragraph; a traceback would only bury it.
        # POLICYOPT_TRACEBACK=1 shows it anyway.
        if os.environ.get("POLICYOPT_TRACEBACK"):
            raise
        if isinstance(err, nonfinite_error):
            print(f"policyopt {args.command}: {err}", file=sys.stderr)
            return 1
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            # Wherever the write was (a checkpoint, a log line, a plot): the machine's
            # state, not a bug; a checkpoint's own error also names the last complete one.
            if isinstance(err, disk_full_error):
                message = str(err)
            else:
                where = f" {err.filename}" if err.filename else " the device"
                message = f"no space left on{where}; free space and run the same command again"
            print(f"policyopt {args.command}: error: {message}", file=sys.stderr)
            return 1
        if not isinstance(err, (*USER_ERRORS, reward_error)):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        if isinstance(err, SyntaxError):
            message = f"{err.msg} in {err.filename} line {err.lineno}"
        print(f"policyopt {args.command}: error: {message}", file=sys.stderr)
        return 2


class _NotLoaded(Exception):
    """Stands for an error class whose module was never imported (nothing raised it)."""


def _loaded(module: str, name: str) -> type[BaseException]:
    """The exception class `name` of `module` if that module was imported, else a class
    that no error is an instance of."""
    return getattr(sys.modules.get(module), name, _NotLoaded)


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
