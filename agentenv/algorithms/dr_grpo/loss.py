"""Dr. GRPO's advantage and loss normalizer, pure functions on tensors.

Shapes: G trajectories of a group; B trajectories in a micro-batch, T predicted tokens.
"""

from __future__ import annotations

import torch

from agentenv.algorithms.base import LossNorm
from agentenv.algorithms.estimators import Estimator


def mean_centred_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = r_i - mean(r): (G,) -> (G,), no std (Liu et al., 2025)."""
    return rewards - rewards.mean()


def constant_normalized_sum(
    per_token: torch.Tensor, mask: torch.Tensor, constant: float, norm: LossNorm | None = None
) -> torch.Tensor:
    """sum over masked tokens of `per_token` (B, T) / (sequences * constant), a scalar.

    No per-sequence length normalization: every token weighs the same whatever
    its trajectory's length. `sequences` are the mini-batch's (`norm`, over every
    micro-batch and process, failed trajectories left out), so micro-batch losses
    add up to the mini-batch's; without `norm`, this micro-batch's own.
    """
    norm = norm or LossNorm.of(mask)
    return (per_token * mask.to(per_token.dtype)).sum() / (norm.sequence_denominator * constant)


DR_GRPO_ESTIMATOR = Estimator(scalars=mean_centred_advantages)
