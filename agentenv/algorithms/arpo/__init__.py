"""ARPO: entropy-guided tree rollouts that fork environments, soft and hard advantages, GRPO's loss."""

from agentenv.algorithms.arpo.algorithm import ARPO, arpo_advantages
from agentenv.algorithms.arpo.branching import entropy_scale, should_branch, window_entropy
from agentenv.algorithms.arpo.config import ARPOConfig
from agentenv.algorithms.arpo.sampler import TreeSampler
from agentenv.algorithms.arpo.tree import shared_token_mean, tree_indices

__all__ = [
    "ARPO",
    "ARPOConfig",
    "TreeSampler",
    "arpo_advantages",
    "entropy_scale",
    "shared_token_mean",
    "should_branch",
    "tree_indices",
    "window_entropy",
]
