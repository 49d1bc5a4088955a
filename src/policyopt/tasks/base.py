"""What a task is: rows of data, a prompt format, a verifier, optional expert solutions.

A task's rows are a Hugging Face `datasets.Dataset` with at least a prompt column; every
column is handed to reward functions as a keyword list (TRL's convention), so a reward
function written for TRL's `GRPOTrainer` works here unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import datasets

from policyopt.core.registry import Registry

# name -> factory(**options) -> Task
TASKS: Registry[Callable[..., Task]] = Registry("task")

# A demonstration as the episode lays it out: (text, trained) segments in order. Text with
# trained False is what an environment writes (a tool's reply): SFT reads it, as the policy
# reads it in a multi-turn episode, but is not trained to predict it.
Demonstration = list[tuple[str, bool]]


class Task(ABC):
    """A registered task. Subclasses fill the split rows and the verifier."""

    name: str = "task"
    prompt_column: str = "prompt"
    answer_column: str = "answer"
    solution_column: str | None = "solution"
    # Evaluation also reports accuracy and mean reward per value of this column (e.g. the
    # difficulty level, or DocPO's element type); None for none.
    eval_group_column: str | None = None
    # The kinds of answer `output_style` tells apart (evaluation reports each one's share);
    # empty for tasks that do not.
    styles: tuple[str, ...] = ()
    # The policy trains from a random start, not from an SFT warm start: ranking policies,
    # and the DMRL editor (its pipeline makes its own warm start). `policyopt train` warns
    # about the untrained embedded model on every other task.
    random_start: bool = False
    # The kind of policy the task trains (`trainer.policy`): "lm", a causal LM over the prompt
    # text, or "ranking", a Plackett-Luce scorer over the task's item table
    # (`tasks.ranking.RankingTask`: its prompts are item ids). `model.name_or_path` names a
    # policy of this kind.
    policy: str = "lm"
    # The JSON schemas of the tools its environment offers (multi-turn rollouts,
    # `policyopt.rollout.environment`), for chat templates that list them in the prompt
    # (`apply_chat_template(..., tools=...)`); empty for none.
    tools: tuple[dict[str, Any], ...] = ()
    # The quickstart pipeline of this task's recipes: "rl" (pipelines/quickstart.py: SFT, RL,
    # held-out evaluation) or "dmrl" (pipelines/dmrl.py: the long-term predictor,
    # the editor's warm start, DRPO and the deployments).
    pipeline: str = "rl"

    # Tasks with state (a live environment that moves on as the policy trains) override
    # these: the trainer checkpoints it (tensors and plain data only) and restores it on resume.
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def end_of_round(self) -> None:
        """A sampling round was scored and shaped: a task with a live world moves it on here
        (DMRL's environment deploys the day's best edit), so that scoring itself never
        changes the world. Nothing for a task without one."""
        return None

    @abstractmethod
    def rows(self, split: str) -> datasets.Dataset:
        """Rows of `split` ("train" or "eval"), with the columns named above."""

    def format_prompt(self, row: dict[str, Any]) -> str:
        """The text the policy sees; the default is the prompt column as it is."""
        return str(row[self.prompt_column])

    @abstractmethod
    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        """Reward of one completion in [0, 1]; None when the completion cannot be parsed
        (the reward pipeline logs it and scores it 0)."""

    def extract_answer(self, completion: str) -> str | None:
        """The final answer in a completion, for maj@k; None if there is none."""
        return None

    def output_style(self, completion: str, row: dict[str, Any]) -> str | None:
        """The kind of answer (one of `styles`) a completion gives, for tasks whose warm
        start mixes kinds; None for tasks that do not tell kinds apart."""
        return None

    def eval_metrics(self, completions: list[str], rows: list[dict[str, Any]]) -> dict[str, float]:
        """Task-specific held-out metrics of greedy completions (`eval/<name>`), beside
        accuracy and mean reward; e.g. a ranking task's NDCG@1/5/10. None by default."""
        return {}

    def expert_solutions(self, row: dict[str, Any]) -> list[str]:
        """Expert step-by-step solutions of a row (GAR anchors, SFT targets, DATPO forks)."""
        if self.solution_column is None or self.solution_column not in row:
            return []
        value = row[self.solution_column]
        if value is None:
            return []
        return [value] if isinstance(value, str) else [str(v) for v in value]

    def prompt_messages(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A conversational row's prompt as chat messages (TRL's conversational format), or
        None for a text prompt (`format_prompt`)."""
        return None

    def sft_targets(self, row: dict[str, Any]) -> list[str]:
        """What supervised warm-up imitates for a row; the expert solutions unless a task
        mixes in other demonstrations."""
        return self.expert_solutions(row)

    def sft_segments(self, row: dict[str, Any]) -> list[Demonstration]:
        """`sft_targets` in segments, which is what SFT trains on (`train/sft.py`). A task
        whose demonstrations hold an environment's text (a tool's reply) overrides it to mark
        that text untrained; the default trains on each target whole."""
        return [[(text, True)] for text in self.sft_targets(row)]


def task_class(name: str) -> type[Task]:
    """The registered task class `name` (its declared attributes, without building it); the
    shipped tasks are registered by importing `policyopt.tasks`."""
    return TASKS.get(name)  # type: ignore[return-value]


def get_task(name: str, **options: Any) -> Task:
    """Build the registered task `name` with its options."""
    return TASKS.get(name)(**options)
