"""policyopt: policy-optimization methods for RL post-training on one small, fast trainer."""

__version__ = "0.1.0"
