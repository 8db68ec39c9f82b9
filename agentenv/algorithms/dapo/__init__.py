"""DAPO: decoupled clip, token-level loss, dynamic sampling, overlong filtering and soft punishment."""

from agentenv.algorithms.dapo.algorithm import DAPO, policy_tokens
from agentenv.algorithms.dapo.config import DAPOConfig
from agentenv.algorithms.dapo.loss import OVERLONG_REASONS, informative, overlong_mask, overlong_penalty

__all__ = ["DAPO", "DAPOConfig", "OVERLONG_REASONS", "informative", "overlong_mask", "overlong_penalty", "policy_tokens"]
