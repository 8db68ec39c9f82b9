"""GSPO as an algorithm plugin: GRPO's sampler and group advantages, a sequence-level clipped loss."""

from __future__ import annotations

from typing import ClassVar

import torch

from agentenv.algorithms.base import LossNorm, TrainBatch
from agentenv.algorithms.grpo.algorithm import GRPO
from agentenv.algorithms.gspo.config import GSPOConfig
from agentenv.algorithms.gspo.loss import gspo_loss, sequence_mean


class GSPO(GRPO):
    """GSPO (Zheng et al., 2025): importance ratio, clipping and loss per sequence, not per token."""

    config_cls: ClassVar[type] = GSPOConfig

    def __init__(self, cfg: GSPOConfig | None = None):
        super().__init__(cfg or GSPOConfig())

    def loss(
        self, batch: TrainBatch, new_logprobs: torch.Tensor, norm: LossNorm | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.loss_mask  # (B, T)
        norm = norm or LossNorm.of(mask)
        per_seq, clipped, ratio = gspo_loss(
            new_logprobs, batch.old_logprobs, batch.advantages, mask, self.cfg.clip_low, self.cfg.clip_high
        )
        loss = sequence_mean(per_seq, norm)
        rows = mask.sum(dim=1) > 0  # (B,)
        n = max(int(rows.sum()), 1)
        with torch.no_grad():
            metrics = {
                "clip_frac": float(clipped.sum()) / n,  # of sequences
                "ratio_mean": float((ratio * rows).sum()) / n,
                "pg_loss": float(per_seq.sum()) / n,  # this micro-batch's mean
            }
        return loss, metrics
