"""REINFORCE++ and REINFORCE++-baseline: the KL penalty in the token-level return, global advantage whitening."""

from agentenv.algorithms.reinforce_pp.algorithm import ReinforcePP, ReinforcePPBaseline
from agentenv.algorithms.reinforce_pp.config import ReinforcePPConfig
from agentenv.algorithms.reinforce_pp.loss import global_whiten, group_mean_baseline, kl_returns, outcome_rewards

__all__ = [
    "ReinforcePP",
    "ReinforcePPBaseline",
    "ReinforcePPConfig",
    "global_whiten",
    "group_mean_baseline",
    "kl_returns",
    "outcome_rewards",
]
