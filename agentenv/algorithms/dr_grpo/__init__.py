"""Dr. GRPO: mean-centred group advantages, token sums over a constant normalizer."""

from agentenv.algorithms.dr_grpo.algorithm import DrGRPO
from agentenv.algorithms.dr_grpo.config import DrGRPOConfig
from agentenv.algorithms.dr_grpo.loss import constant_normalized_sum, mean_centred_advantages

__all__ = ["DrGRPO", "DrGRPOConfig", "constant_normalized_sum", "mean_centred_advantages"]
