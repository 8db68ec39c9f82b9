"""GRPO as an algorithm plugin: independent sampling, group advantages, clipped loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from agentenv.algorithms.base import Algorithm, LossNorm, Reduce, TrainBatch, group_generated_tokens
from agentenv.algorithms.core import Estimator, aggregate, broadcast, get_estimator, group_scalars, policy_loss
from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.envs.episode import MakeEnv
from agentenv.policies.base import Policy
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.engine import RolloutEngine
from agentenv.tasks.task import Task
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

    async def sample(self, policy: Policy, make_env: MakeEnv, task: Task, params: SamplingParams, seed: int) -> Group:
        if self._engine is None or self._engine.policy is not policy:
            self._engine = RolloutEngine(policy, self.rollout)
        return await self._engine.run_group(make_env, task, self.n, params, seed)


def trajectory_advantages(group: Group, normalize_std: bool = True) -> list[float]:
    """One scalar advantage per trajectory (GRPO's, or Dr. GRPO's without the std); failed ones get 0
    and do not move the group's statistics."""
    return group_scalars(group, get_estimator("grpo" if normalize_std else "dr_grpo").scalars)


class GRPO(Algorithm):
    """GRPO (Shao et al., 2024) with DAPO's clip-higher and token-mean options.

    Presets that differ only in the advantage (RLOO, REINFORCE++; `agentenv.algorithms.presets`)
    name their `estimator_name`, whose batch step, if any, runs in `finalize`;
    one that differs in the loss's normalizer (Dr. GRPO) overrides `aggregate`.
    """

    config_cls: ClassVar[type] = GRPOConfig
    estimator_name: ClassVar[str | None] = None  # None: `grpo`, or `dr_grpo` without normalize_std

    def __init__(self, cfg: GRPOConfig | None = None):
        super().__init__(cfg)

    def estimator(self) -> Estimator:
        """The trajectory-level advantage estimator (`agentenv.algorithms.core`)."""
        if self.estimator_name is not None:
            return get_estimator(self.estimator_name)
        return get_estimator("grpo" if self.cfg.normalize_std else "dr_grpo")

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, norm: LossNorm | None) -> torch.Tensor:
        """The loss's reduction of (B, T) per-token terms to a scalar: `core.aggregate` with `loss_agg`."""
        return aggregate(per_token, mask, self.cfg.loss_agg, norm)

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
        return policy_loss(batch, new_logprobs, self.cfg, norm, kl_coef=kl_coef, agg=self.aggregate)

