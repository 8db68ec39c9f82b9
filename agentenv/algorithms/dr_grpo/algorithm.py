"""Dr. GRPO as an algorithm plugin: GRPO's sampler, mean-centred advantages, a constant loss normalizer."""

from __future__ import annotations

from typing import ClassVar

import torch

from agentenv.algorithms.base import LossNorm, TrainBatch
from agentenv.algorithms.dr_grpo.config import DrGRPOConfig
from agentenv.algorithms.dr_grpo.loss import constant_normalized_sum
from agentenv.algorithms.grpo.algorithm import GRPO, policy_loss


class DrGRPO(GRPO):
    """Dr. GRPO (Liu et al., 2025): GRPO without the std in the advantage and without length normalization."""

    config_cls: ClassVar[type] = DrGRPOConfig

    def __init__(self, cfg: DrGRPOConfig | None = None):
        super().__init__(cfg or DrGRPOConfig())

    def loss(
        self, batch: TrainBatch, new_logprobs: torch.Tensor, norm: LossNorm | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.cfg.loss_constant
        return policy_loss(batch, new_logprobs, self.cfg, norm, agg=lambda p, m, n: constant_normalized_sum(p, m, c, n))
