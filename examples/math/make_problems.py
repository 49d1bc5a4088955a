"""Writes train.jsonl and eval.jsonl: small arithmetic word problems with `\\boxed{}` answers.

Easy on purpose: the walkthrough trains SmolLM2-135M-Instruct on a CPU, and a 135 M model
gets some of these right, so the reward has room to move. `python make_problems.py` rewrites
the files (seeded, so the output is the same each time).
"""

import json
import random
from pathlib import Path

TEMPLATES = [
    ("What is {a} + {b}?", lambda a, b: a + b),
    ("What is {a} - {b}?", lambda a, b: a - b),
    ("What is {a} times {b}?", lambda a, b: a * b),
    ("Tom has {a} apples and buys {b} more. How many apples does he have now?", lambda a, b: a + b),
    ("A box holds {a} pens. {b} pens are taken out. How many pens are left?", lambda a, b: a - b),
    ("There are {a} rows of chairs with {b} chairs in each row. How many chairs are there?",
     lambda a, b: a * b),
]


def problem(rng: random.Random) -> dict[str, str]:
    text, fn = rng.choice(TEMPLATES)
    a, b = rng.randint(2, 12), rng.randint(1, 9)
    if fn(a, b) < 0:
        a, b = b, a
    solution = f"The answer is \\boxed{{{fn(a, b)}}}."
    return {"problem": text.format(a=a, b=b), "answer": str(fn(a, b)), "solution": solution}


def main() -> None:
    rng = random.Random(0)
    here = Path(__file__).parent
    for name, n in (("train", 400), ("eval", 100)):
        rows = [problem(rng) for _ in range(n)]
        (here / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
