"""DAPO as an algorithm plugin: GRPO's sampler, advantage and clipped token loss, with dynamic sampling and
overlong handling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from agentenv.algorithms.base import Reduce, StepRollout, TrainBatch
from agentenv.algorithms.core import broadcast, episode_rewards, valid_advantages
from agentenv.algorithms.dapo.config import DAPOConfig
from agentenv.algorithms.dapo.loss import OVERLONG_REASONS, informative, overlong_mask, overlong_penalty
from agentenv.algorithms.dynamic_sampling import DynamicSampling
from agentenv.algorithms.grpo.algorithm import GRPO
from agentenv.types import Group, Trajectory


def policy_tokens(traj: Trajectory) -> int:
    """Policy tokens in a trajectory (what the soft overlong punishment measures)."""
    return sum(len(s) for s in traj.segments if s.source == "policy")


class DAPO(GRPO):
    """DAPO (Yu et al., 2025): clip-higher, token-level loss, dynamic sampling, overlong filtering and penalty.

    Dynamic sampling is `resample`'s: it asks `keep_group` of every group and
    samples more tasks (at most `algorithm.max_resample_rounds` extra rounds; `DynamicSampling`).
    """

    config_cls: ClassVar[type] = DAPOConfig
    cfg: DAPOConfig

    def shaped_rewards(self, group: Group) -> list[float]:
        """The rewards the advantage sees: with `overlong_penalty`, plus the soft overlong punishment."""
        rewards = [t.reward for t in group.trajectories]
        if not self.cfg.overlong_penalty:
            return rewards
        lengths = torch.tensor([policy_tokens(t) for t in group.trajectories])
        pen = overlong_penalty(lengths, self.cfg.overlong_max_tokens, self.cfg.overlong_cache_tokens)
        return [r + p for r, p in zip(rewards, pen.tolist())]

    def advantages(self, group: Group) -> list[torch.Tensor]:
        valid = [not t.failed for t in group.trajectories]
        episodes = [t.episode for t in group.trajectories]
        scalars = valid_advantages(self.shaped_rewards(group), valid, self.estimator().scalars, episodes)
        return [broadcast(t, a) for t, a in zip(group.trajectories, scalars)]

    def keep_group(self, group: Group) -> bool:
        """Dynamic sampling's filter: keep a group whose valid episodes' (shaped) rewards differ."""
        if not self.cfg.dynamic_sampling:
            return True
        trajs = group.trajectories
        rewards, _ = episode_rewards(self.shaped_rewards(group), [not t.failed for t in trajs], [t.episode for t in trajs])
        return informative(torch.tensor(rewards, dtype=torch.float64))  # (E,): episodes, not trajectories

    def max_resample_rounds(self) -> int:
        return int(self.cfg.max_resample_rounds)

    def resample(self, groups: list[Group], rollout: StepRollout) -> tuple[list[Group], dict[str, float]]:
        """Dynamic sampling: the groups `keep_group` rejects replaced by new tasks' groups (`DynamicSampling`)."""
        return DynamicSampling(self.keep_group, self.max_resample_rounds()).refill(groups, rollout)

    def finalize(self, batch: TrainBatch, trajectories: Sequence[Trajectory], reduce: Reduce) -> dict[str, float]:
        """Overlong filtering: trajectories cut by a token budget leave the loss (and its normalizer)."""
        if not self.cfg.overlong_filter:
            return {}
        overlong = torch.tensor([t.finish_reason in OVERLONG_REASONS and not t.failed for t in trajectories])
        counts = reduce(torch.tensor([float(overlong.sum()), float(len(trajectories))], dtype=torch.float64))
        batch.loss_mask.copy_(overlong_mask(batch.loss_mask, overlong))
        batch.advantages.mul_(batch.loss_mask)
        return {"overlong_filtered": float(counts[0]) / max(float(counts[1]), 1.0)}
