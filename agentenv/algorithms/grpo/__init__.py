"""GRPO: independent group sampling, group-normalized advantages, clipped token loss."""

from agentenv.algorithms.grpo.algorithm import GRPO, IndependentSampler, policy_loss, trajectory_advantages
from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.algorithms.grpo.loss import (
    aggregate,
    clipped_pg_loss,
    group_advantages,
    kl_k3,
    masked_mean,
    rollout_weights,
)

__all__ = [
    "GRPO",
    "GRPOConfig",
    "IndependentSampler",
    "aggregate",
    "clipped_pg_loss",
    "group_advantages",
    "kl_k3",
    "masked_mean",
    "policy_loss",
    "rollout_weights",
    "trajectory_advantages",
]
