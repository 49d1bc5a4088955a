"""Sampling-based evaluation metrics: pass@k, avg@k, maj@k.

- pass@k, the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
  Trained on Code", arXiv 2107.03374): from n ≥ k samples of which c are correct,
  pass@k = 1 − C(n−c, k) / C(n, k). Computed as the product 1 − Π_{i=n−c+1}^{n} (1 − k/i),
  which never forms the (huge) binomial coefficients.
- avg@k: the mean correctness of k samples (equals pass@1's estimate when rewards are 0/1).
- maj@k (self-consistency, Wang et al. 2022, arXiv 2203.11171): the majority answer among
  the parseable samples is judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k)/C(n, k)."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pass_at_k: {name} must be an int, got {value!r}")
    if k < 1:
        raise ValueError(f"pass_at_k: k must be at least 1, got k={k}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} exceeds the number of samples n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} must be between 0 and n={n}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    # C(n−c, k)/C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i)
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def pass_at_k_curve(n: int, c: int, ks: Sequence[int]) -> list[float]:
    """pass@k for each k in `ks`."""
    return [pass_at_k(n, c, k) for k in ks]


def avg_at_k(correct: Sequence[float]) -> float:
    """Mean correctness (or reward) over the k samples."""
    if len(correct) == 0:
        raise ValueError("avg_at_k needs at least one sample")
    return sum(float(x) for x in correct) / len(correct)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool]) -> float:
    """1.0 if the majority answer is correct, else 0.0.

    answers[j] is sample j's extracted answer (None when it could not be parsed) and
    correct[j] whether it is right. The vote counts only parseable answers; a tie goes to the
    answer seen first. The majority answer is judged by its first sample's `correct`
    (samples with the same answer are judged alike by a deterministic verifier). No
    parseable answer gives 0.0.
    """
    if len(answers) != len(correct):
        raise ValueError(f"maj_at_k: {len(answers)} answers but {len(correct)} correctness flags")
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    # Counter.most_common keeps first-insertion order among equal counts: ties -> first seen.
    winner = votes.most_common(1)[0][0]
    return 1.0 if correct[answers.index(winner)] else 0.0
