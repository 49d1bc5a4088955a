"""policyopt: policy-optimization methods for RL post-training on one small, fast trainer."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# Idle OpenMP threads spin briefly, then sleep (libgomp's default spins 300x longer): on
# cores shared with other jobs, spinning threads made steps 3-10x slower
# (policyopt.models.threads). libgomp (torch's OpenMP on Linux) reads this when torch
# starts, so it must be set before `import torch`; a wait policy the user chose
# (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is kept.
if "torch" not in _sys.modules and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(_os.environ):
    _os.environ["GOMP_SPINCOUNT"] = "1000"
