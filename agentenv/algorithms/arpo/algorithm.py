"""ARPO as an algorithm plugin: GRPO with the tree sampler and soft or hard advantages (its loss is GRPO's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from agentenv.algorithms.arpo.config import ARPOConfig
from agentenv.algorithms.arpo.metrics import tree_metrics
from agentenv.algorithms.arpo.sampler import TreeSampler
from agentenv.algorithms.arpo.tree import counted_once, shared_token_mean, tree_indices
from agentenv.algorithms.base import Reduce, TrainBatch
from agentenv.algorithms.core import Estimator, broadcast, estimator_for, group_scalars
from agentenv.algorithms.grpo.algorithm import GRPO
from agentenv.rollout.config import RolloutConfig
from agentenv.types import Group, Trajectory


def estimator_of(cfg: ARPOConfig) -> Estimator:
    """`cfg.estimator` (`grpo` without `normalize_std`: `dr_grpo`)."""
    return estimator_for(cfg.estimator, cfg)


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


class ARPO(GRPO):
    """Agentic Reinforced Policy Optimization (Dong et al., 2025, arXiv 2507.19849): GRPO on entropy-guided trees.

    What differs from GRPO: the sampler (`TreeSampler`), the estimator chosen by
    `algorithm.estimator`, the `hard` advantages, and `hard_once`'s batch step
    before the estimator's; the loss is GRPO's.
    """

    config_cls: ClassVar[type] = ARPOConfig
    grows_trees: ClassVar[bool] = True  # branches share their parent's prefix: the update packs them
    cfg: ARPOConfig

    def estimator(self) -> Estimator:
        return estimator_of(self.cfg)

    def sampler(self, rollout: RolloutConfig | None = None) -> TreeSampler:
        return TreeSampler(self.cfg, rollout)

    def advantages(self, group: Group) -> list[torch.Tensor]:
        return arpo_advantages(group, self.cfg)

    def finalize(self, batch: TrainBatch, trajectories: Sequence[Trajectory], reduce: Reduce) -> dict[str, float]:
        """For `hard_once`, each shared token counted once; then GRPO's (the estimator's batch step)."""
        metrics: dict[str, float] = {}
        if self.cfg.advantage == "hard_once":  # first, so later batch-level steps see each token once
            metrics.update(count_shared_once(batch, trajectories, reduce))
        metrics.update(super().finalize(batch, trajectories, reduce))
        return metrics

    def rollout_metrics(self, groups: Sequence[Group], reduce: Reduce) -> dict[str, float]:
        """The trees' `arpo/*` metrics: branches, branch points, ΔH, the budget (`arpo.metrics`)."""
        return tree_metrics(groups, self.cfg.branch_budget, reduce)
