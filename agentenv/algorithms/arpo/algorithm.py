"""ARPO as an algorithm plugin: the tree sampler, soft or hard advantages, GRPO's loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from agentenv.algorithms.arpo.config import ARPOConfig
from agentenv.algorithms.arpo.metrics import tree_metrics
from agentenv.algorithms.arpo.sampler import TreeSampler
from agentenv.algorithms.arpo.tree import counted_once, shared_token_mean, tree_indices
from agentenv.algorithms.base import Algorithm, LossNorm, Reduce, TrainBatch, group_generated_tokens
from agentenv.algorithms.core import Estimator, broadcast, get_estimator, group_scalars, policy_loss
from agentenv.rollout.config import RolloutConfig
from agentenv.types import Group, Trajectory


def estimator_of(cfg: ARPOConfig) -> Estimator:
    """`cfg.estimator`; `grpo` without `normalize_std` is Dr. GRPO's mean-centred advantage."""
    return get_estimator("dr_grpo" if cfg.estimator == "grpo" and not cfg.normalize_std else cfg.estimator)


def arpo_advantages(group: Group, cfg: ARPOConfig) -> list[torch.Tensor]:
    """Per trajectory, a (len,) tensor: the estimator's group advantage (soft), or its mean over shared tokens (hard, hard_once)."""
    scalars = group_scalars(group, estimator_of(cfg).scalars)  # over all M trajectories of the tree
    trajs = group.trajectories
    if cfg.advantage == "soft":
        return [broadcast(t, a) for t, a in zip(trajs, scalars)]
    parents, branch = tree_indices(trajs)
    return shared_token_mean(scalars, [len(t) for t in trajs], parents, branch, valid=[not t.failed for t in trajs])


def count_shared_once(batch: TrainBatch, trajectories: Sequence[Trajectory], reduce: Reduce) -> dict[str, float]:
    """`advantage: hard_once`: drop the copies of shared tokens from the loss, in place.

    Row i of `batch` is `trajectories[i]`; a tree's rows are found by uid (the
    batch may hold several trees). Each shared token stays in its carrier's row
    (`tree.counted_once`), which holds the mean advantage already.

    Returns:
        `arpo/once_dropped`: the fraction of the policy tokens dropped, over
        every process's batch (`reduce` sums over processes).
    """
    if len(trajectories) != len(batch):
        raise ValueError(f"{len(batch)} batch rows but {len(trajectories)} trajectories")
    parents, branch = tree_indices(trajectories)
    keep = counted_once([len(t) for t in trajectories], parents, branch, valid=[not t.failed for t in trajectories])
    before = batch.loss_mask.sum().to(torch.float64)
    for i, k in enumerate(keep):
        n = k.shape[0]
        if n > 1:
            cols = k[1:].to(batch.loss_mask.dtype)  # (n-1,): column c is token c + 1
            batch.loss_mask[i, : n - 1] *= cols
            batch.advantages[i, : n - 1] *= cols
    counts = reduce(torch.stack([before, batch.loss_mask.sum().to(torch.float64)]))  # (2,) before, after
    return {"arpo/once_dropped": 1.0 - float(counts[1]) / float(counts[0]) if float(counts[0]) else 0.0}


class ARPO(Algorithm):
    """Agentic Reinforced Policy Optimization (Dong et al., 2025, arXiv 2507.19849)."""

    config_cls: ClassVar[type] = ARPOConfig
    grows_trees: ClassVar[bool] = True  # branches share their parent's prefix: the update packs them
    cfg: ARPOConfig

    def __init__(self, cfg: ARPOConfig | None = None):
        super().__init__(cfg or ARPOConfig())

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
        """Batch-level steps (see `Algorithm`): for `hard_once`, each shared token counted once; then the
        estimator's batch step, if it has one (REINFORCE++: KL in the return, global whitening)."""
        metrics: dict[str, float] = {}
        if self.cfg.advantage == "hard_once":  # first, so later batch-level steps see each token once
            metrics.update(count_shared_once(batch, trajectories, reduce))
        step = estimator_of(self.cfg).batch_step
        if step is not None:
            metrics.update(step(batch, reduce, self.cfg))
        return metrics

    def rollout_metrics(self, groups: Sequence[Group], reduce: Reduce) -> dict[str, float]:
        """The trees' `arpo/*` metrics: branches, branch points, ΔH, the budget (`arpo.metrics`)."""
        return tree_metrics(groups, self.cfg.branch_budget, reduce)

    def loss(
        self, batch: TrainBatch, new_logprobs: torch.Tensor, norm: LossNorm | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        kl_coef = 0.0 if estimator_of(self.cfg).kl_in_return else None  # the KL is in the return already
        return policy_loss(batch, new_logprobs, self.cfg, norm, kl_coef=kl_coef)
