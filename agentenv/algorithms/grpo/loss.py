"""GRPO's loss as a chain of pure functions on tensors.

Shapes: B trajectories in a micro-batch, T predicted tokens per trajectory.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from agentenv.algorithms.base import LossNorm
from agentenv.algorithms.estimators import Estimator

LossAgg = Literal["token_mean", "seq_mean_token_mean"]
RolloutCorrection = Literal["none", "tis", "mis"]
CorrectionLevel = Literal["token", "sequence"]


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


def kl_k3(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Schulman's k3 estimator of KL(new || ref), per token: exp(d) - d - 1, d = ref - new. (B, T).

    With `mask`, d is 0 (and so is the estimate) where the mask is 0, before the
    exponential: masked positions hold no real reference logprob (0), and
    exp(0 - new) overflows to inf once new < -88.7 (float32), making inf * 0 = NaN
    in the loss and its gradient.
    """
    d = ref_logprobs - new_logprobs
    if mask is not None:
        d = torch.where(mask.bool(), d, torch.zeros_like(d))  # (B, T); no gradient flows to masked new
    return torch.exp(d) - d - 1.0


def rollout_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: RolloutCorrection,
    level: CorrectionLevel = "token",
    cap: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights for tokens sampled by one engine and trained under another.

    rho = pi_old / pi_sampler, the trainer's probability of a sampled token over
    the sampler's (they differ by kernels, precision, or a stale engine): per
    token (`token`), or the product over a trajectory's policy tokens on each of
    its tokens (`sequence`). TIS (truncated IS, Yao et al. 2025) weighs by
    min(rho, C); MIS (masked IS, Liu et al. 2025) by rho where rho <= C and 0
    beyond. As in TRL's `vllm_importance_sampling_mode` and verl's `rollout_is`;
    a zeroed token still counts in the loss's normalizer (an IS estimate
    averages over every sample drawn). Computed in log space: no overflow.

    Args:
        old_logprobs, sampler_logprobs, mask: (B, T).
        mode: `none` (weights 1), `tis` or `mis`.
        level: `token` or `sequence`.
        cap: C > 1.
    Returns:
        (B, T) weights, no gradient (1 where masked), and a (B, T) bool tensor of
        where rho exceeded C (truncated or dropped).
    """
    mask = mask.to(old_logprobs.dtype)
    log_rho = (old_logprobs - sampler_logprobs).detach() * mask  # (B, T); 0 where masked
    if level == "sequence":
        log_rho = log_rho.sum(dim=1, keepdim=True).expand_as(log_rho)  # (B, T): log of the product
    elif level != "token":
        raise ValueError(f"unknown rollout correction level {level!r}; use 'token' or 'sequence'")
    log_cap = math.log(cap)
    over = (log_rho > log_cap) & mask.bool()  # (B, T)
    if mode == "none":
        return torch.ones_like(log_rho), over
    capped = torch.exp(log_rho.clamp(max=log_cap))  # (B, T), at most C
    if mode == "tis":
        return capped, over
    if mode == "mis":
        return torch.where(over, torch.zeros_like(capped), capped), over
    raise ValueError(f"unknown rollout correction {mode!r}; use 'none', 'tis' or 'mis'")


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: LossAgg = "token_mean", norm: LossNorm | None = None
) -> torch.Tensor:
    """Reduce a (B, T) per-token quantity to a scalar over masked tokens.

    - token_mean: sum over masked tokens / number of masked tokens (DAPO).
    - seq_mean_token_mean: sum over sequences of each sequence's token mean /
      number of sequences (the original GRPO); sequences with no masked token
      (failed trajectories) are left out of both.

    The counts are the mini-batch's (`norm`, over every micro-batch and process),
    so the losses of its micro-batches add up to the mini-batch's mean; without
    `norm`, this micro-batch's own.
    """
    norm = norm or LossNorm.of(mask)
    mask = mask.to(per_token.dtype)
    if mode == "token_mean":
        return (per_token * mask).sum() / norm.token_denominator
    if mode == "seq_mean_token_mean":
        tokens = mask.sum(dim=1)  # (B,)
        seq_means = (per_token * mask).sum(dim=1) / tokens.clamp(min=1.0)  # (B,); 0 for a row with no token
        return seq_means.sum() / norm.sequence_denominator
    raise ValueError(f"unknown loss aggregation mode {mode!r}; use 'token_mean' or 'seq_mean_token_mean'")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _group_normalized(rewards: torch.Tensor) -> torch.Tensor:
    return group_advantages(rewards, normalize_std=True)  # (G,)


GRPO_ESTIMATOR = Estimator(scalars=_group_normalized)
