"""ARPO as an algorithm plugin: the tree sampler, soft or hard advantages, GRPO's loss."""

from __future__ import annotations

from typing import ClassVar, Sequence

import torch

from agentenv.algorithms.arpo.config import ARPOConfig
from agentenv.algorithms.arpo.sampler import TreeSampler
from agentenv.algorithms.arpo.tree import shared_token_mean, tree_indices
from agentenv.algorithms.base import LossNorm, Reduce, TrainBatch, group_generated_tokens
from agentenv.algorithms.estimators import Estimator, get_estimator, group_scalars
from agentenv.algorithms.grpo.algorithm import broadcast, policy_loss
from agentenv.rollout.engine import RolloutConfig
from agentenv.types import Group, Trajectory


def estimator_of(cfg: ARPOConfig) -> Estimator:
    """`cfg.estimator`; `grpo` without `normalize_std` is Dr. GRPO's mean-centred advantage."""
    return get_estimator("dr_grpo" if cfg.estimator == "grpo" and not cfg.normalize_std else cfg.estimator)


def arpo_advantages(group: Group, cfg: ARPOConfig) -> list[torch.Tensor]:
    """Per trajectory, a (len,) tensor: GRPO's group advantage (soft), or its mean over shared tokens (hard)."""
    scalars = group_scalars(group, estimator_of(cfg).scalars)  # over all M trajectories of the tree
    trajs = group.trajectories
    if cfg.advantage == "soft":
        return [broadcast(t, a) for t, a in zip(trajs, scalars)]
    parents, branch = tree_indices(trajs)
    return shared_token_mean(scalars, [len(t) for t in trajs], parents, branch, valid=[not t.failed for t in trajs])


class ARPO:
    """Agentic Reinforced Policy Optimization (Dong et al., 2025, arXiv 2507.19849)."""

    config_cls: ClassVar[type] = ARPOConfig
    grows_trees: ClassVar[bool] = True  # branches share their parent's prefix: the update packs them

    def __init__(self, cfg: ARPOConfig | None = None):
        self.cfg = cfg or ARPOConfig()

    def group_size(self) -> int:
        """M: every trajectory of a task's tree, branches included."""
        return self.cfg.group_size

    def sampler(self, rollout: RolloutConfig | None = None) -> TreeSampler:
        return TreeSampler(self.cfg, rollout)

    def generated_tokens(self, group: Group) -> int:
        """A tree's shared prefixes count once."""
        return group_generated_tokens(group)

    def advantages(self, group: Group) -> list[torch.Tensor]:
        return arpo_advantages(group, self.cfg)

    def finalize(self, batch: TrainBatch, trajectories: Sequence[Trajectory], reduce: Reduce) -> dict[str, float]:
        """The estimator's batch step, if it has one (REINFORCE++: KL in the return, global whitening)."""
        step = estimator_of(self.cfg).batch_step
        return step(batch, reduce, self.cfg) if step is not None else {}

    def loss(
        self, batch: TrainBatch, new_logprobs: torch.Tensor, norm: LossNorm | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        kl_coef = 0.0 if estimator_of(self.cfg).kl_in_return else None  # the KL is in the return already
        return policy_loss(batch, new_logprobs, self.cfg, norm, kl_coef=kl_coef)
