"""DMRL (arXiv 2609.02170): an LM editor of a skill document for an advertising system.

Parts:
- `drpo` advantage estimator (`drpo.py`): robust group term + control term − edit cost;
- `grad_reverse` (`grad_reverse.py`): the LRP's gradient-reversal layer;
- `token_edit_distance`, `EditCost` (`edit_cost.py`): the edit cost C(e).
"""

from policyopt.methods.dmrl import drpo  # noqa: F401  (registers the "drpo" advantage)
from policyopt.methods.dmrl.edit_cost import EditCost, token_edit_distance
from policyopt.methods.dmrl.grad_reverse import grad_reverse

__all__ = ["EditCost", "grad_reverse", "token_edit_distance"]
