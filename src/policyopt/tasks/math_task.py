"""Math problems from a file, graded by answer equivalence with `math-verify`.

Registered as `math`; rows load as in `hf_dataset` (same path, column and split options, the
same checks of the file, and TRL's conversational prompts: the prompt template then wraps the
last user message).
The predicted answer is the content of the last `\\boxed{...}` of the completion (braces
matched); the gold answer is the answer column (boxed if it is not already). The reward is
`verify(parse(gold), parse(pred))`: 1.0 if equivalent (`\\frac{1}{2}` = `0.5`), else 0.0;
None when the completion has no `\\boxed{}` or its content cannot be parsed.

Timeouts: math-verify guards parsing and comparison with `signal.alarm`, which works only
on the main thread (where the reward pipeline calls reward functions: its own time limit per
call, `policyopt.rewards.isolation`, uses another signal). On the main thread this task uses `timeout_seconds` (a timed-out
comparison scores 0); on any other thread it calls math-verify with timeouts disabled
(math-verify logs a warning once), so a pathological expression can then hang the thread:
call `verify` from the main thread, or from worker processes, when inputs may be hostile.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from policyopt.rewards.functions import REWARD_FUNCTIONS
from policyopt.tasks.base import TASKS
from policyopt.tasks.hf_dataset import HFDatasetTask

_BOXED = "\\boxed{"


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text`, nested braces matched; None if there is
    none or its braces do not close."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth = 0
    for i in range(start + len(_BOXED) - 1, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_BOXED) : i]
    return None


def _timeout(seconds: int) -> int | None:
    """math-verify's signal timeout is usable only on the main thread."""
    return seconds if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=65536)
def _parse_gold(gold: str, timeout: int | None) -> list:
    from math_verify import parse  # here: it loads sympy, which only this task needs

    parsed = parse(gold if _BOXED in gold else _BOXED + gold + "}", parsing_timeout=timeout)
    if not parsed:
        raise ValueError(f"math task: cannot parse the gold answer {gold!r}")
    return parsed


@REWARD_FUNCTIONS.register("boxed_format")
def boxed_format_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """1.0 if the completion has a `\\boxed{...}` whose braces close, else 0.0: a format
    reward to add beside the `math` verifier (which scores an answer without a box None)."""
    return [0.0 if last_boxed(c) is None else 1.0 for c in completions]


@TASKS.register("math")
class MathTask(HFDatasetTask):
    """`hf_dataset` rows with a math-verify verifier; see the module doc."""

    name = "math"

    def __init__(
        self,
        path: str,
        prompt_column: str = "problem",
        answer_column: str = "answer",
        solution_column: str | None = None,
        eval_path: str | None = None,
        eval_fraction: float | None = None,
        seed: int = 0,
        prompt_template: str = "{prompt}\nPut the final answer in \\boxed{}.",
        timeout_seconds: int = 5,
    ) -> None:
        if timeout_seconds < 1:
            raise ValueError(f"math task: timeout_seconds must be >= 1, got {timeout_seconds}")
        self.timeout_seconds = timeout_seconds
        super().__init__(
            path,
            prompt_column=prompt_column,
            answer_column=answer_column,
            solution_column=solution_column,
            eval_path=eval_path,
            eval_fraction=eval_fraction,
            seed=seed,
            prompt_template=prompt_template,
        )

    def extract_answer(self, completion: str) -> str | None:
        """The stripped content of the last `\\boxed{}`; None if there is none."""
        content = last_boxed(completion)
        return None if content is None else content.strip()

    def verify(self, completion: str, row: dict[str, Any]) -> float | None:
        content = self.extract_answer(completion)
        if not content:
            return None
        from math_verify import parse, verify  # here: it loads sympy (see _parse_gold)

        timeout = _timeout(self.timeout_seconds)
        predicted = parse(_BOXED + content + "}", parsing_timeout=timeout)
        if not predicted:
            return None
        gold = _parse_gold(str(row[self.answer_column]).strip(), timeout)
        return 1.0 if verify(gold, predicted, timeout_seconds=timeout) else 0.0
