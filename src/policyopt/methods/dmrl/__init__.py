"""DMRL (arXiv 2609.02170): an LM editor of a skill document for an advertising system.

Parts:
- `drpo` advantage estimator (`drpo.py`): robust group term + control term − edit cost;
- `grad_reverse` (`grad_reverse.py`): the LRP's gradient-reversal layer;
- `token_edit_distance`, `EditCost` (`edit_cost.py`): the edit cost C(e);
- the LRP (`lrp.py`, inputs `lrp_features.py`, training `lrp_train.py`, files `lrp_io.py`)
  and the surrogate-index baseline (`surrogate.py`);
- `dmrl_lrp` reward function (`reward.py`): LRP-predicted reward, control rewards, edit costs.
The environment (simulator, A/B tests, skill document, lower agent) is in
`policyopt.tasks.adsim` and `policyopt.tasks.skilldoc`; the pipeline in
`policyopt.recipes.dmrl_pipeline`.
"""

from policyopt.methods.dmrl import drpo, reward  # noqa: F401  (register drpo, dmrl_lrp)
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
