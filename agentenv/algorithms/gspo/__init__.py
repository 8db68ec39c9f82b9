"""GSPO: a sequence-level, length-normalized importance ratio, clipped per sequence."""

from agentenv.algorithms.gspo.algorithm import GSPO
from agentenv.algorithms.gspo.config import GSPOConfig
from agentenv.algorithms.gspo.loss import gspo_loss, sequence_log_ratio, sequence_mean

__all__ = ["GSPO", "GSPOConfig", "gspo_loss", "sequence_log_ratio", "sequence_mean"]
