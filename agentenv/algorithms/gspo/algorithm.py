"""GSPO as an algorithm plugin: GRPO's sampler and group advantages, the sequence-level clipped loss `gspo`."""

from __future__ import annotations

from typing import ClassVar

from agentenv.algorithms.grpo.algorithm import GRPO
from agentenv.algorithms.gspo.config import GSPOConfig


class GSPO(GRPO):
    """GSPO (Zheng et al., 2025): importance ratio, clipping and loss per sequence, not per token."""

    config_cls: ClassVar[type] = GSPOConfig
    loss_name: ClassVar[str] = "gspo"  # agentenv.algorithms.gspo.loss.gspo_policy_loss
