"""Tasks: data sets with prompt formats, verifiers and expert solutions.

Importing this package registers every task in `TASKS`: `arithmetic` (embedded, synthetic),
`hf_dataset` (JSONL/Parquet file, exact match or a reward function) and `math` (file,
math-verify equivalence).
"""

from policyopt.tasks.arithmetic import ArithmeticTask
from policyopt.tasks.base import TASKS, Task, get_task
from policyopt.tasks.docparse import DocParseTask  # noqa: F401  (registers `docparse`)
from policyopt.tasks.hf_dataset import HFDatasetTask
from policyopt.tasks.math_task import MathTask

__all__ = ["TASKS", "ArithmeticTask", "HFDatasetTask", "MathTask", "Task", "get_task"]
