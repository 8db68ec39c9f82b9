"""GRPO as an algorithm plugin: independent sampling, group advantages, clipped loss."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import torch

from agentenv.algorithms.base import Algorithm, LossNorm, Reduce, TrainBatch, group_generated_tokens
from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.algorithms.estimators import Estimator, get_estimator, group_scalars
from agentenv.algorithms.grpo.loss import aggregate, clipped_pg_loss, kl_k3, masked_mean
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


def trajectory_advantages(group: Group, normalize_std: bool = True) -> list[float]:
    """One scalar advantage per trajectory (GRPO's, or Dr. GRPO's without the std); failed ones get 0
    and do not move the group's statistics."""
    return group_scalars(group, get_estimator("grpo" if normalize_std else "dr_grpo").scalars)


def broadcast(traj: Trajectory, value: float) -> torch.Tensor:
    """A trajectory-level advantage on every token: (len(traj),)."""
    return torch.full((len(traj),), float(value), dtype=torch.float32)


class GRPO(Algorithm):
    """GRPO (Shao et al., 2024) with DAPO's clip-higher and token-mean options.

    Subclasses that differ only in the advantage (RLOO, REINFORCE++) override
    `estimator`; its batch step, if any, runs in `finalize`.
    """

    config_cls: ClassVar[type] = GRPOConfig

    def __init__(self, cfg: GRPOConfig | None = None):
        super().__init__(cfg or GRPOConfig())

    def estimator(self) -> Estimator:
        """The trajectory-level advantage estimator (`agentenv.algorithms.estimators`)."""
        return get_estimator("grpo" if self.cfg.normalize_std else "dr_grpo")

    def group_size(self) -> int:
        return self.cfg.group_size

    def sampler(self, rollout: RolloutConfig | None = None) -> IndependentSampler:
        return IndependentSampler(self.cfg.group_size, rollout)

    def generated_tokens(self, group: Group) -> int:
        return group_generated_tokens(group)

    def advantages(self, group: Group) -> list[torch.Tensor]:
        scalars = group_scalars(group, self.estimator().scalars)
        return [broadcast(t, a) for t, a in zip(group.trajectories, scalars)]

    def finalize(self, batch: TrainBatch, trajectories: Sequence[Trajectory], reduce: Reduce) -> dict[str, float]:
        """The estimator's batch step (REINFORCE++'s KL-in-return and global whitening), if it has one."""
        step = self.estimator().batch_step
        return step(batch, reduce, self.cfg) if step is not None else {}

    def loss(
        self, batch: TrainBatch, new_logprobs: torch.Tensor, norm: LossNorm | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        kl_coef = 0.0 if self.estimator().kl_in_return else None  # the KL is in the return already
        return policy_loss(batch, new_logprobs, self.cfg, norm, kl_coef=kl_coef)


def policy_loss(
    batch: TrainBatch,
    new_logprobs: torch.Tensor,
    cfg: GRPOConfig,
    norm: LossNorm | None = None,
    *,
    kl_coef: float | None = None,
    agg: Callable[[torch.Tensor, torch.Tensor, LossNorm | None], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's loss on one micro-batch, normalized by `norm` (the mini-batch's counts; None: this
    micro-batch's); shared by algorithms that reuse it (ARPO, DAPO, Dr. GRPO, RLOO, REINFORCE++).
    Metrics are this micro-batch's means.

    Args:
        kl_coef: The k3 KL term's weight in the loss (None: `cfg.kl_coef`; 0 where
            the KL lives in the return, as REINFORCE++'s).
        agg: `agg(per_token, mask, norm)` -> the scalar loss (None: `aggregate` with
            `cfg.loss_agg`), e.g. Dr. GRPO's constant normalizer.
    """
    kl_coef = cfg.kl_coef if kl_coef is None else kl_coef
    agg = agg or (lambda per_token, mask, n: aggregate(per_token, mask, cfg.loss_agg, n))
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
    if kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch")
        kl = kl_k3(new_logprobs, batch.ref_logprobs, mask)  # (B, T)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = masked_mean(kl.detach(), mask).item()
    loss = agg(per_token, mask, norm)
    with torch.no_grad():
        metrics["clip_frac"] = masked_mean(clipped.float(), mask).item()
        metrics["ratio_mean"] = masked_mean(torch.exp(new_logprobs - batch.old_logprobs), mask).item()
        metrics["pg_loss"] = agg(per_token, mask, None).item()  # this micro-batch's mean
    return loss, metrics
