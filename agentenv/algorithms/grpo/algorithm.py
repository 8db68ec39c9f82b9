"""GRPO as an algorithm plugin: independent sampling, group advantages, clipped loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from agentenv.algorithms.base import Algorithm, LossNorm, Reduce, Sampler, TrainBatch
from agentenv.algorithms.core import Estimator, broadcast, estimator_for, get_loss, group_scalars
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
    return group_scalars(group, estimator_for("grpo", GRPOConfig(normalize_std=normalize_std)).scalars)


class GRPO(Algorithm):
    """GRPO (Shao et al., 2024) with DAPO's clip-higher and token-mean options, and the base of its family.

    A member names its advantage estimator and its policy loss, both registered
    by name in `agentenv.algorithms.core`; `finalize` runs the estimator's batch
    step, if any. A variant that differs only in those (RLOO, Dr. GRPO,
    REINFORCE++, GSPO) is a config class and the two names
    (`agentenv.algorithms.presets`); ARPO, DAPO and GiGPO override the hooks they change.
    """

    config_cls: ClassVar[type] = GRPOConfig
    estimator_name: ClassVar[str] = "grpo"  # `grpo` without the config's normalize_std is `dr_grpo` (`estimator_for`)
    loss_name: ClassVar[str] = "clipped"

    def __init__(self, cfg: Any = None):
        super().__init__(cfg)
        self.estimator()  # an unknown estimator or loss name fails here, not at the first step
        get_loss(self.loss_name)

    def estimator(self) -> Estimator:
        """The trajectory-level advantage estimator (`agentenv.algorithms.core`)."""
        return estimator_for(self.estimator_name, self.cfg)

    def sampler(self, rollout: RolloutConfig | None = None) -> Sampler:
        return IndependentSampler(self.cfg.group_size, rollout)

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
        """The policy loss `loss_name` (with no KL term where the estimator put the KL in the return)."""
        return get_loss(self.loss_name)(batch, new_logprobs, self.cfg, norm, kl_in_return=self.estimator().kl_in_return)
