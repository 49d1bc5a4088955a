"""DMRL's environment (arXiv 2609.02170): the advertising platform (`adsim`: simulator,
A/B tests, history), the skill document and its lower agent (`skilldoc`), the long-term
reward predictor and its surrogate-index baseline (`lrp`), the `dmrl_lrp` reward and the
pipeline that runs them (`pipeline`); the editor as an episode (`episode`)."""

from policyopt.envs.ads import episode, reward  # noqa: F401  (dmrl_editor, dmrl_lrp)
from policyopt.envs.ads.skilldoc import grammar, task  # noqa: F401  (dmrl_skill, grammars)
