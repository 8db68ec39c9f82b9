"""GRPO as an algorithm plugin: independent sampling, group advantages, clipped loss."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from agentenv.algorithms.base import LossNorm, TrainBatch, group_generated_tokens
from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.algorithms.grpo.loss import aggregate, clipped_pg_loss, group_advantages, kl_k3, masked_mean
from agentenv.algorithms.grpo.loss import rollout_weights
from agentenv.rollout.engine import RolloutConfig, RolloutEngine
from agentenv.types import Group, SamplingParams, Trajectory


class IndependentSampler:
    """Samples `n` complete trajectories of one task independently.

    Args:
        n: Trajectories per task (G).
        rollout: Per-trajectory timeout and concurrency; one engine serves
            every `sample` call of this sampler, so `max_concurrency` bounds
            the episodes in flight over all of them.
    """

    def __init__(self, n: int, rollout: RolloutConfig | None = None):
        self.n = n
        self.rollout = rollout or RolloutConfig()
        self._engine: RolloutEngine | None = None

    async def sample(self, policy: Any, make_env: Any, task: Any, params: SamplingParams, seed: int) -> Group:
        if self._engine is None or self._engine.policy is not policy:
            self._engine = RolloutEngine(policy, self.rollout)
        return await self._engine.run_group(make_env, task, self.n, params, seed)


def trajectory_advantages(group: Group, normalize_std: bool) -> list[float]:
    """One scalar advantage per trajectory; failed ones get 0 and do not move the group's statistics."""
    ok = [i for i, t in enumerate(group.trajectories) if not t.failed]
    out = [0.0] * len(group.trajectories)
    if len(ok) < 2:
        return out
    rewards = torch.tensor([group.trajectories[i].reward for i in ok], dtype=torch.float64)
    adv = group_advantages(rewards, normalize_std=normalize_std)
    for i, a in zip(ok, adv.tolist()):
        out[i] = a
    return out


def broadcast(traj: Trajectory, value: float) -> torch.Tensor:
    """A trajectory-level advantage on every token: (len(traj),)."""
    return torch.full((len(traj),), float(value), dtype=torch.float32)


class GRPO:
    """GRPO (Shao et al., 2024) with DAPO's clip-higher and token-mean options."""

    config_cls: ClassVar[type] = GRPOConfig

    def __init__(self, cfg: GRPOConfig | None = None):
        self.cfg = cfg or GRPOConfig()

    def group_size(self) -> int:
        return self.cfg.group_size

    def sampler(self, rollout: RolloutConfig | None = None) -> IndependentSampler:
        return IndependentSampler(self.cfg.group_size, rollout)

    def generated_tokens(self, group: Group) -> int:
        return group_generated_tokens(group)

    def advantages(self, group: Group) -> list[torch.Tensor]:
        scalars = trajectory_advantages(group, self.cfg.normalize_std)
        return [broadcast(t, a) for t, a in zip(group.trajectories, scalars)]

    def loss(
        self, batch: TrainBatch, new_logprobs: torch.Tensor, norm: LossNorm | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return policy_loss(batch, new_logprobs, self.cfg, norm)


def policy_loss(
    batch: TrainBatch, new_logprobs: torch.Tensor, cfg: GRPOConfig, norm: LossNorm | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's loss on one micro-batch, normalized by `norm` (the mini-batch's counts; None: this
    micro-batch's); shared by algorithms that reuse it (ARPO). Metrics are this micro-batch's means."""
    mask = batch.loss_mask  # (B, T)
    per_token, clipped = clipped_pg_loss(new_logprobs, batch.old_logprobs, batch.advantages, cfg.clip_low, cfg.clip_high)
    metrics: dict[str, float] = {}
    if cfg.rollout_correction != "none":
        w, over = rollout_weights(
            batch.old_logprobs, batch.sampler_logprobs, mask,
            cfg.rollout_correction, cfg.rollout_correction_level, cfg.rollout_correction_cap,
        )  # fmt: skip
        per_token = per_token * w  # (B, T); the policy-gradient term only, as TRL and verl
        metrics["is_weight_mean"] = masked_mean(w, mask).item()
        metrics["is_capped_frac"] = masked_mean(over.float(), mask).item()
    if cfg.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch")
        kl = kl_k3(new_logprobs, batch.ref_logprobs, mask)  # (B, T)
        per_token = per_token + cfg.kl_coef * kl
        metrics["kl"] = masked_mean(kl.detach(), mask).item()
    loss = aggregate(per_token, mask, cfg.loss_agg, norm)
    with torch.no_grad():
        metrics["clip_frac"] = masked_mean(clipped.float(), mask).item()
        metrics["ratio_mean"] = masked_mean(torch.exp(new_logprobs - batch.old_logprobs), mask).item()
        metrics["pg_loss"] = aggregate(per_token, mask, cfg.loss_agg).item()  # this micro-batch's mean
    return loss, metrics
