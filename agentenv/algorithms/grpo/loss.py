"""GRPO's loss as a chain of pure functions on tensors.

Shapes: B trajectories in a micro-batch, T predicted tokens per trajectory.
"""

from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token_mean", "seq_mean_token_mean"]


def group_advantages(rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's outcome advantage: A_i = (r_i - mean(r)) / (std(r) + eps).

    Args:
        rewards: (G,) rewards of one group.
        normalize_std: Divide by the group's std (GRPO); off gives Dr. GRPO's
            mean-centred advantage.
    Returns:
        (G,) advantages. A group whose rewards are all equal gets zeros.
    """
    centred = rewards - rewards.mean()  # (G,)
    if not normalize_std or rewards.numel() < 2:
        return centred
    # unbiased std as in GRPO's reference implementations
    return centred / (rewards.std(unbiased=True) + eps)


def clipped_pg_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level PPO clipped surrogate with separate low/high clip ranges.

    loss_t = -min(rho_t * A_t, clip(rho_t, 1 - clip_low, 1 + clip_high) * A_t),
    rho_t = exp(new_t - old_t).

    Args:
        new_logprobs, old_logprobs, advantages: (B, T).
    Returns:
        per-token loss (B, T) and a (B, T) bool tensor of where clipping bit.
    """
    ratio = torch.exp(new_logprobs - old_logprobs)  # (B, T)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)  # (B, T)
    was_clipped = clipped < unclipped  # the min picked the clipped branch
    return per_token, was_clipped


def kl_k3(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(new || ref), per token: exp(d) - d - 1, d = ref - new. (B, T)."""
    d = ref_logprobs - new_logprobs
    return torch.exp(d) - d - 1.0


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: LossAgg = "token_mean") -> torch.Tensor:
    """Reduce a (B, T) per-token quantity to a scalar over masked tokens.

    - token_mean: sum over all masked tokens / number of masked tokens (DAPO).
    - seq_mean_token_mean: mean over sequences of each sequence's token mean
      (the original GRPO); sequences with no masked token are left out.
    """
    mask = mask.to(per_token.dtype)
    if mode == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        tokens = mask.sum(dim=1)  # (B,)
        seq_means = (per_token * mask).sum(dim=1) / tokens.clamp(min=1.0)  # (B,)
        has = (tokens > 0).to(per_token.dtype)
        return (seq_means * has).sum() / has.sum().clamp(min=1.0)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; use 'token_mean' or 'seq_mean_token_mean'")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)
