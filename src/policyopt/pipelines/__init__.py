"""What `policyopt quickstart` runs: the pipeline a task's recipes need, by the task's
declared `Task.pipeline` name.

- `rl` (`quickstart`): SFT warm start (cached), held-out evaluation, RL, evaluation again;
- `dmrl` (`dmrl`): the long-term reward predictor, the editor's warm start, DRPO over live
  days, the long-term value of the deployed configuration.

Each is a run function (config, console) -> summary and its module's `headline(summary,
out)`, the one line the command prints.
"""

from __future__ import annotations

import importlib
from typing import Any

from rich.console import Console

from policyopt.config.load import Config

# name -> (module, its run function)
PIPELINES = {
    "rl": ("policyopt.pipelines.quickstart", "run_pipeline"),
    "dmrl": ("policyopt.pipelines.dmrl", "run_dmrl_pipeline"),
}


def run_quickstart(config: Config, console: Console, out: str) -> tuple[dict[str, Any], str]:
    """(summary, headline) of the pipeline that `config`'s task declares."""
    import policyopt.tasks  # noqa: F401  (registers the shipped tasks)
    from policyopt.tasks.base import task_class

    module_name, run = PIPELINES[task_class(config.task.name).pipeline]
    module = importlib.import_module(module_name)
    summary = getattr(module, run)(config, console)
    return summary, module.headline(summary, out)
