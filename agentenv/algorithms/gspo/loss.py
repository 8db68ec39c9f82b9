"""GSPO's loss as pure functions on tensors (Zheng et al., 2025).

Shapes: B trajectories in a micro-batch, T predicted tokens per trajectory.
"""

from __future__ import annotations

from typing import Any

import torch

from agentenv.algorithms.base import LossNorm, TrainBatch


def sequence_log_ratio(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log s_i = mean over i's policy tokens of (new - old): (B,); 0 for a row with no policy token."""
    mask = mask.to(new_logprobs.dtype)
    n = mask.sum(dim=1)  # (B,)
    return ((new_logprobs - old_logprobs) * mask).sum(dim=1) / n.clamp(min=1.0)


def gspo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO's clipped surrogate per sequence.

    s_i = exp(mean_t(new - old)) (length-normalized sequence ratio);
    loss_i = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i),
    with A_i the trajectory's advantage (its policy tokens all hold it).

    Args:
        new_logprobs, old_logprobs, advantages, mask: (B, T).
    Returns:
        (B,) per-sequence loss (0 for rows with no policy token), (B,) bool of
        where the clip bit, and (B,) s_i.
    """
    m = mask.to(advantages.dtype)
    n = m.sum(dim=1)  # (B,)
    adv = (advantages * m).sum(dim=1) / n.clamp(min=1.0)  # (B,) the trajectory's A_i
    ratio = torch.exp(sequence_log_ratio(new_logprobs, old_logprobs, mask))  # (B,)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_seq = -torch.minimum(unclipped, clipped) * (n > 0)  # (B,)
    return per_seq, (clipped < unclipped) & (n > 0), ratio


def sequence_mean(per_seq: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """sum of per-sequence losses / the mini-batch's sequences (over micro-batches and processes)."""
    return per_seq.sum() / norm.sequence_denominator


def gspo_policy_loss(
    batch: TrainBatch, new_logprobs: torch.Tensor, cfg: Any, norm: LossNorm | None, *, kl_in_return: bool
) -> tuple[torch.Tensor, dict[str, float]]:
    """`gspo` (`agentenv.algorithms.core.PolicyLoss`): `gspo_loss` clipped by `cfg.clip_low` / `cfg.clip_high`, its
    mean over the mini-batch's sequences; metrics per sequence. GSPO has no KL term."""
    mask = batch.loss_mask  # (B, T)
    norm = norm or LossNorm.of(mask)
    per_seq, clipped, ratio = gspo_loss(new_logprobs, batch.old_logprobs, batch.advantages, mask, cfg.clip_low, cfg.clip_high)
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
