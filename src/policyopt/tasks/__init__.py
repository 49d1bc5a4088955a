"""Tasks: data sets with prompt formats, verifiers and expert solutions.

Importing this package registers every task in `TASKS`: `arithmetic` (embedded, synthetic),
`countdown` (embedded, long search traces),
`hf_dataset` (JSONL/Parquet file, exact match or a reward function) and `math` (file,
math-verify equivalence); learning to rank: `ltr_synthetic` (embedded), `ltr_clicks` (click feedback), `ltr_diversity`
(α-NDCG over subtopics), `letor` and `mslr`; DMRL's skill-document editing: `dmrl_skill`.
"""

from policyopt.tasks.arithmetic import ArithmeticTask
from policyopt.tasks.base import TASKS, Task, get_task
from policyopt.tasks.countdown import CountdownTask
from policyopt.tasks.docparse import DocParseTask  # noqa: F401  (registers `docparse`, its rewards)
from policyopt.tasks.hf_dataset import HFDatasetTask
from policyopt.tasks.ltr_clicks import ClickLTRTask  # noqa: F401  (registers `ltr_clicks`)
from policyopt.tasks.ltr_diversity import DiversityLTRTask  # noqa: F401  (registers it)
from policyopt.tasks.ltr_synthetic import SyntheticLTRTask  # noqa: E402  (after ranking)
from policyopt.tasks.math_task import MathTask
from policyopt.tasks.ranking import LetorTask, MSLRTask, RankingTask
from policyopt.tasks.rerank import RerankTask  # noqa: F401  (registers `rerank`)
from policyopt.tasks.skilldoc import task as _skilldoc  # noqa: F401  (registers `dmrl_skill`)

__all__ = [
    "TASKS",
    "ArithmeticTask",
    "CountdownTask",
    "HFDatasetTask",
    "LetorTask",
    "MSLRTask",
    "MathTask",
    "RankingTask",
    "SyntheticLTRTask",
    "Task",
    "get_task",
]
