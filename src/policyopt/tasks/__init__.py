"""Tasks: data sets with prompt formats, verifiers and expert solutions.

Importing this package registers the library's tasks in `TASKS`: `arithmetic` (embedded,
synthetic), `countdown` (embedded, long search traces), `tool_arithmetic` (embedded, with the
`calculator` environment for multi-turn rollouts), `hf_dataset` (JSONL/Parquet file, exact
match or a reward function), `math` (file, math-verify equivalence), and `letor` and `mslr`
(learning-to-rank files). The single-method environments (`docparse`, `dmrl_skill`,
`ltr_synthetic`, `ltr_clicks`, `ltr_diversity`, `rerank`) are declared here and imported on
first use (`policyopt.tasks.environments`).
"""

from policyopt.tasks import environments  # noqa: F401  (declares the environments' names)
from policyopt.tasks.arithmetic import ArithmeticTask
from policyopt.tasks.base import TASKS, Task, get_task
from policyopt.tasks.countdown import CountdownTask
from policyopt.tasks.hf_dataset import HFDatasetTask
from policyopt.tasks.math_task import MathTask
from policyopt.tasks.ranking import LetorTask, MSLRTask, RankingTask
from policyopt.tasks.tool_arithmetic import ToolArithmeticTask  # also the "calculator" environment

__all__ = [
    "TASKS",
    "ArithmeticTask",
    "CountdownTask",
    "HFDatasetTask",
    "LetorTask",
    "MSLRTask",
    "MathTask",
    "RankingTask",
    "Task",
    "ToolArithmeticTask",
    "get_task",
]
