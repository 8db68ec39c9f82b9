"""REINFORCE++'s advantage as pure functions on tensors (Hu, 2025, arXiv 2501.03262).

The outcome reward sits on a trajectory's last policy token; each policy token
t also gets the per-token penalty -beta * KL_t (k1, log pi_old - log pi_ref);
the return (gamma = 1) is G_t = r - beta * sum_{s >= t} KL_s over policy tokens;
advantages are the returns whitened over every policy token of the global batch.
We follow OpenRLHF (Hu's framework, `experience_maker.compute_advantages_and_returns`):
k1 in the reward, population variance, 1 / sqrt(max(var, 1e-8)). verl's
`compute_reinforce_plus_plus_outcome_advantage` differs on multi-turn masks: it
restarts the return at every masked token, so a tool result inside the response
changes the first turn's advantage, where here the return runs over the policy
tokens only, across tool results; and by Bessel's correction in the variance.
For the baseline variant, verl also differs in where the KL goes, not only
by Bessel's correction.

Shapes: G trajectories of a group; B trajectories, T predicted tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from agentenv.algorithms.base import Reduce, TrainBatch
from agentenv.algorithms.estimators import Estimator


def outcome_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE++: the outcome reward itself, (G,) -> (G,); the baseline is the global mean (whitening)."""
    return rewards.clone()


def group_mean_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE++-baseline: r_i - mean(r) over the group, (G,) -> (G,)."""
    return rewards - rewards.mean()


def kl_returns(
    advantages: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """Per-token returns with the KL penalty folded in: G_t = A_t - kl_coef * sum_{s >= t} KL_s. (B, T).

    Args:
        advantages: (B, T) the outcome part on each policy token (the group
            estimator's scalar, broadcast).
        old_logprobs, ref_logprobs: (B, T) under the sampling weights and the reference.
        mask: (B, T) 1 on policy tokens; the KL of other tokens is 0 and the
            result is 0 there.
    """
    mask = mask.to(advantages.dtype)
    kl = (old_logprobs - ref_logprobs) * mask  # (B, T) k1 per token
    tail = kl.flip(dims=[1]).cumsum(dim=1).flip(dims=[1])  # (B, T) sum over s >= t
    return (advantages - kl_coef * tail) * mask


def global_whiten(
    values: torch.Tensor, mask: torch.Tensor, reduce: Reduce, normalize_std: bool = True
) -> tuple[torch.Tensor, float, float]:
    """(values - mean) / std over every masked token of every process; (B, T), 0 where masked.

    `reduce` sums over processes, so the mean and the (population) std are the
    global batch's, not this process's. Returns the whitened values, the mean
    and the std.
    """
    m = mask.to(torch.float64)
    v = values.to(torch.float64)
    s = reduce(torch.stack([(v * m).sum(), m.sum()]))  # (2,) global sum and count
    n = max(float(s[1]), 1.0)
    mean = float(s[0]) / n
    var = float(reduce(((v - mean) ** 2 * m).sum().reshape(1))[0]) / n  # second pass: no cancellation
    std = max(var, 1e-8) ** 0.5
    out = (v - mean) / (std if normalize_std else 1.0) * m
    return out.to(values.dtype), mean, std


def reinforce_pp_step(batch: TrainBatch, reduce: Reduce, cfg: Any) -> dict[str, float]:
    """The batch step: KL folded into the return (when `cfg.kl_coef` > 0), then global whitening
    (`cfg.normalize_std`: divide by the std too). Rewrites `batch.advantages` in place."""
    mask = batch.loss_mask
    metrics: dict[str, float] = {}
    returns = batch.advantages * mask  # (B, T)
    if cfg.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch")
        returns = kl_returns(returns, batch.old_logprobs, batch.ref_logprobs, mask, cfg.kl_coef)
        kl = ((batch.old_logprobs - batch.ref_logprobs) * mask).to(torch.float64)
        s = reduce(torch.stack([kl.sum(), mask.to(torch.float64).sum()]))
        metrics["kl_in_return"] = float(s[0]) / max(float(s[1]), 1.0)
    adv, mean, std = global_whiten(returns, mask, reduce, cfg.normalize_std)
    batch.advantages.copy_(adv)
    metrics.update(return_mean=mean, return_std=std)
    return metrics


REINFORCE_PP_ESTIMATOR = Estimator(scalars=outcome_rewards, batch_step=reinforce_pp_step, kl_in_return=True)
REINFORCE_PP_BASELINE_ESTIMATOR = Estimator(scalars=group_mean_baseline, batch_step=reinforce_pp_step, kl_in_return=True)
