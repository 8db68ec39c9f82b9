"""GRPO: independent group sampling, group-normalized advantages, clipped token loss (its math: `agentenv.algorithms.core`)."""

from agentenv.algorithms.core import broadcast
from agentenv.algorithms.grpo.algorithm import GRPO, IndependentSampler, trajectory_advantages
from agentenv.algorithms.grpo.config import GroupConfig, GRPOConfig, MeanLossConfig, TokenLossConfig

__all__ = [
    "GRPO",
    "GRPOConfig",
    "GroupConfig",
    "IndependentSampler",
    "MeanLossConfig",
    "TokenLossConfig",
    "broadcast",
    "trajectory_advantages",
]
