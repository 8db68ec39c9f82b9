"""Dynamic sampling (DAPO): the groups a filter rejects are replaced by groups of new tasks, in lockstep rounds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from agentenv.algorithms.base import StepRollout
from agentenv.types import Group


@dataclass(frozen=True)
class DynamicSampling:
    """Replaces the groups `keep` rejects with groups of new tasks, in at most `max_rounds` extra rounds.

    Attributes:
        keep: The group filter (DAPO: the valid trajectories' rewards differ).
        max_rounds: Cap on the extra rounds of one step (DAPO's `max_resample_rounds`).
    """

    keep: Callable[[Group], bool]
    max_rounds: int

    def refill(self, groups: list[Group], rollout: StepRollout) -> tuple[list[Group], dict[str, float]]:
        """This process's kept groups (as many as `groups`) and the counts over every process.

        Rounds run in lockstep on every process: each round draws `world` times the
        largest shortage of any process from the task stream (so every process's
        stream stays alike), and each process rolls out the tasks of its share it
        still needs, with seeds of their own round. The first kept groups are used;
        after `max_rounds` rounds the slots left take dropped groups (their
        advantage is zero), so every process ends with as many groups as it
        started with. `rollout.reduce` is called once per round and once more, the same number of times on every process.
        """
        rank, world = rollout.rank, rollout.world
        need = len(groups)
        kept: list[Group] = []
        dropped: list[Group] = []
        rounds = 0
        while True:
            for g in groups:
                (kept if self.keep(g) else dropped).append(g)
            short = torch.zeros(world, dtype=torch.float64)
            short[rank] = need - len(kept)
            short = rollout.reduce(short)  # (world,) every process's shortage
            most = int(short.max())
            if most == 0 or rounds >= self.max_rounds:
                break
            rounds += 1
            tasks = rollout.draw(most * world)
            mine = tasks[rank::world][: int(short[rank])]
            indices = list(range(rank, len(tasks), world))[: len(mine)]
            groups = rollout.rollout(mine, indices, rounds) if mine else []
        filled = need - len(kept)
        counts = rollout.reduce(torch.tensor([float(len(dropped)), float(filled)], dtype=torch.float64))
        metrics = {
            "rollout/resample_rounds": float(rounds),
            "rollout/dropped_groups": float(counts[0]),  # groups with equal rewards, all rounds, all processes
            "rollout/filled_groups": float(counts[1]),  # slots given dropped groups when the cap was reached
        }
        return kept + dropped[:filled], metrics
