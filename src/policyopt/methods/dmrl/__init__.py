"""DMRL (arXiv 2609.02170): an LM editor of a skill document for an advertising system.

Parts:
- `drpo` advantage estimator (`drpo.py`): robust group term + control term − edit cost;
- `grad_reverse` (`grad_reverse.py`): the LRP's gradient-reversal layer;
- `token_edit_distance`, `EditCost` (`edit_cost.py`): the edit cost C(e);
The environment (simulator, A/B tests, skill document, lower agent), the LRP and its
surrogate-index baseline, the `dmrl_lrp` reward and the pipeline are `policyopt.envs.ads`
(the `dmrl` extra), imported when a config names them.
"""

from policyopt.methods.dmrl import drpo  # noqa: F401  (registers drpo)
from policyopt.methods.dmrl.drpo import ALPHA, DELTA, LAMBDA_EDIT
from policyopt.methods.dmrl.edit_cost import EditCost, token_edit_distance
from policyopt.methods.dmrl.grad_reverse import grad_reverse
from policyopt.methods.presets import register_preset

register_preset(
    "dmrl",
    {
        "algorithm": {
            "advantage": "drpo",
            "advantage_options": {"alpha": ALPHA, "lambda_edit": LAMBDA_EDIT, "delta": DELTA},
            "loss": "ppo_clip",
            "agg": "seq-mean-token-mean",
        },
        "reward": {"functions": [{"name": "dmrl_lrp", "weight": 1.0}]},
    },
)

__all__ = ["EditCost", "grad_reverse", "token_edit_distance"]
