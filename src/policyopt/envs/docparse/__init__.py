"""DocPO's document-parsing task and its verifiers (arXiv 2608.04417; SPEC section 5).

- `task`: the `docparse` task (synthetic page elements: text, tables, formulas);
- `reward`: the `docparse` reward function and its per-type variants (registered);
- `text`, `table` (TEDS, with `ted`'s exact tree edit distance) and `formula` (LaTeX
  normalisation and sympy equivalence): the per-type verifiers. Table and formula checks run
  out of process under a time limit (`policyopt.rewards.workers`).
"""

from policyopt.envs.docparse.task import DocParseTask

__all__ = ["DocParseTask"]
