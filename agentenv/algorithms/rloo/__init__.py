"""RLOO: the leave-one-out baseline over a group of independent samples."""

from agentenv.algorithms.rloo.algorithm import RLOO
from agentenv.algorithms.rloo.config import RLOOConfig
from agentenv.algorithms.rloo.loss import leave_one_out_advantages

__all__ = ["RLOO", "RLOOConfig", "leave_one_out_advantages"]
