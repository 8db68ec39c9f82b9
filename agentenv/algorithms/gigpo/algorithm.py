"""GiGPO as algorithm plugins: GRPO's sampler or ARPO's tree, episode- plus step-level advantages, GRPO's loss."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from agentenv.algorithms.arpo.algorithm import ARPO
from agentenv.algorithms.base import Reduce, TrainBatch
from agentenv.algorithms.core import broadcast, valid_advantages
from agentenv.algorithms.gigpo.config import GiGPOConfig, StepConfig, TreeGiGPOConfig
from agentenv.algorithms.gigpo.steps import (
    anchor_group_advantages,
    discounted_returns,
    exact_anchor_ids,
    group_sizes,
    similar_anchor_ids,
)
from agentenv.algorithms.grpo.algorithm import GRPO
from agentenv.envs.state import context_keys
from agentenv.types import Group, Trajectory

Scalars = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Steps:
    """The policy turns of one trajectory: token spans, the state each acts from, its key."""

    spans: list[tuple[int, int]]  # [start, end) token indices of each policy segment
    keys: list[str]
    states: list[list[int]]  # the token ids after the prompt before each turn (for `anchors: similarity`)


def steps_of(traj: Trajectory, with_states: bool = False) -> Steps:
    """A trajectory's steps; its env's state keys, or (none given) the context hash from its tokens."""
    spans, states, pos, ids = [], [], 0, traj.token_ids
    # a group's trajectories share their prompt: compared, it would only dilute the difference between states
    start = len(traj.segments[0]) if traj.segments and traj.segments[0].source == "prompt" else 0
    for seg in traj.segments:
        if seg.source == "policy":
            spans.append((pos, pos + len(seg)))
            if with_states:
                states.append(ids[start:pos])
        pos += len(seg)
    keys = list(traj.state_keys) if traj.state_keys else context_keys(traj)
    if len(keys) != len(spans):
        raise ValueError(
            f"trajectory {traj.uid} has {len(spans)} policy turns but {len(keys)} state keys; "
            "an env records one key per turn (Trajectory.state_keys)"
        )
    return Steps(spans, keys, states)


def step_weighted_scalars(group: Group, scalars: Scalars) -> list[float]:
    """Episode-level advantages with each trajectory's reward counted once per step (verl-agent's
    `compute_mean_std_cross_steps`); failed trajectories get 0 and do not count."""
    trajs = group.trajectories
    turns = [sum(seg.source == "policy" for seg in t.segments) for t in trajs]
    rows = [i for i, t in enumerate(trajs) if not t.failed for _ in range(turns[i])]
    per_row = valid_advantages([trajs[i].reward for i in rows], [True] * len(rows), scalars)  # one per step
    out = [0.0] * len(trajs)
    for i, a in zip(rows, per_row):
        out[i] = a
    return out


def gigpo_advantages(group: Group, cfg: StepConfig, episode: Sequence[torch.Tensor], scalars: Scalars) -> list[torch.Tensor]:
    """A = A^E + ω·A^S per token (eq. 8): `episode`, (len,) per trajectory, plus each step's anchor-group advantage
    on its own tokens.

    Steps of failed trajectories take no part. Each valid trajectory's
    `info["gigpo"]` records its steps' advantages and anchor group sizes (the
    algorithm's metrics).
    """
    trajs = group.trajectories
    valid = [i for i, t in enumerate(trajs) if not t.failed]
    steps = {i: steps_of(trajs[i], with_states=cfg.anchors == "similarity") for i in valid}
    owner = [(i, s) for i in valid for s in range(len(steps[i].spans))]  # (S,) trajectory and turn of each step
    out = [e.clone().to(torch.float32) for e in episode]
    if not owner:
        return out
    returns = torch.cat([discounted_returns(len(steps[i].spans), trajs[i].reward, cfg.gamma) for i in valid])  # (S,)
    if cfg.anchors == "key":
        ids = exact_anchor_ids([steps[i].keys[s] for i, s in owner])
    else:
        ids = similar_anchor_ids([steps[i].states[s] for i, s in owner], cfg.similarity_threshold)
    step_adv = anchor_group_advantages(returns, ids, scalars)  # (S,)
    sizes = group_sizes(ids)
    for k, (i, s) in enumerate(owner):
        a, b = steps[i].spans[s]
        out[i][a:b] += cfg.step_advantage_weight * float(step_adv[k])
    for i in valid:
        mine = [k for k, (j, _) in enumerate(owner) if j == i]
        trajs[i].info["gigpo"] = {
            "step_advantages": [float(step_adv[k]) for k in mine],
            "anchor_sizes": [sizes[k] for k in mine],
        }
    return out


def step_metrics(trajectories: Sequence[Trajectory], reduce: Reduce) -> dict[str, float]:
    """Over the batch (every process): the share of steps in an anchor group of size > 1, and the
    step-level advantage's spread (std, mean |A^S|) over steps."""
    n = shared = s1 = s2 = sabs = 0.0
    for t in trajectories:
        rec = t.info.get("gigpo") if not t.failed else None
        if not rec:
            continue
        a = torch.tensor(rec["step_advantages"], dtype=torch.float64)
        n += a.numel()
        shared += sum(size > 1 for size in rec["anchor_sizes"])
        s1 += float(a.sum())
        s2 += float((a * a).sum())
        sabs += float(a.abs().sum())
    n, shared, s1, s2, sabs = reduce(torch.tensor([n, shared, s1, s2, sabs], dtype=torch.float64)).tolist()
    if n == 0:
        return {"gigpo/steps": 0.0, "gigpo/anchor_share": 0.0, "gigpo/step_adv_std": 0.0, "gigpo/step_adv_abs_mean": 0.0}
    mean = s1 / n
    return {
        "gigpo/steps": n,
        "gigpo/anchor_share": shared / n,
        "gigpo/step_adv_std": max(s2 / n - mean * mean, 0.0) ** 0.5,
        "gigpo/step_adv_abs_mean": sabs / n,
    }


class StepCredit(GRPO):
    """GiGPO's step level on top of an episode-level member of GRPO's family: `advantages` adds ω·A^S
    to the next class's advantages (A^E), `finalize` adds the step metrics to its own."""

    cfg: StepConfig

    def episode_advantages(self, group: Group) -> list[torch.Tensor]:
        """A^E, (len,) per trajectory: the advantages of the algorithm this one adds a step level to."""
        return super().advantages(group)

    def advantages(self, group: Group) -> list[torch.Tensor]:
        # the estimator also normalizes the step returns inside an anchor group (eq. 7)
        return gigpo_advantages(group, self.cfg, self.episode_advantages(group), self.estimator().scalars)

    def finalize(self, batch: TrainBatch, trajectories: Sequence[Trajectory], reduce: Reduce) -> dict[str, float]:
        return {**super().finalize(batch, trajectories, reduce), **step_metrics(trajectories, reduce)}


class GiGPO(StepCredit):
    """GiGPO (Feng et al., 2025): GRPO's episode-level advantage plus ω times a step-level one from anchor-state groups."""

    config_cls: ClassVar[type] = GiGPOConfig
    cfg: GiGPOConfig

    def episode_advantages(self, group: Group) -> list[torch.Tensor]:
        if self.cfg.episode_weighting == "step":
            scalars = step_weighted_scalars(group, self.estimator().scalars)
            return [broadcast(t, a) for t, a in zip(group.trajectories, scalars)]
        return super().episode_advantages(group)


class TreeGiGPO(StepCredit, ARPO):
    """GiGPO's step-level advantage on ARPO's trees: a branch point's continuations are one anchor group by construction."""

    config_cls: ClassVar[type] = TreeGiGPOConfig
    cfg: TreeGiGPOConfig
