"""Held-out evaluation: accuracy, unbiased pass@k, tool calls and tokens per task."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from agentenv._loops import gather_settled
from agentenv.algorithms.core import episode_outcomes
from agentenv.envs.episode import MakeEnv
from agentenv.policies.base import Policy
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.toolstats import ToolStats
from agentenv.tasks.task import Task
from agentenv.training.passk import pass_at_k
from agentenv.types import Group, SamplingParams


@dataclass
class EvalReport:
    """What an evaluation measured.

    Attributes:
        accuracy: Share of all samples that were correct (= mean pass@1).
        pass_at: k -> mean unbiased pass@k over tasks, for k = 1..samples.
        reward: Mean reward over samples.
        tool_calls: Mean tool calls per task (summed over its samples / samples).
        tokens: Mean generated (policy) tokens per sample.
        failed: Samples whose rollout failed on infrastructure.
        by_kind: accuracy per `task.metadata["kind"]` (or ability).
        n_tasks, n_samples: Sizes (a sample is an episode, however many trajectories it recorded).
        tools: Per tool: calls, failed calls by `ToolResult.kind`, and the share that
            failed (`agentenv.rollout.toolstats`).
        groups: The groups themselves (not in the JSON), for the run's rollout record.
    """

    accuracy: float
    pass_at: dict[int, float]
    reward: float
    tool_calls: float
    tokens: float
    failed: int
    by_kind: dict[str, float] = field(default_factory=dict)
    n_tasks: int = 0
    n_samples: int = 0
    tool_stats: ToolStats = field(default_factory=ToolStats, repr=False)
    groups: list[Group] = field(default_factory=list, repr=False)

    @property
    def tools(self) -> dict[str, object]:
        return self.tool_stats.as_dict()

    def to_json(self) -> dict[str, object]:
        """The report as the eval JSON holds it, with one record per task (`per_task`)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("tool_stats", "groups")}
        out["tools"] = self.tools
        out["per_task"] = self.per_task()
        return out

    def per_task(self) -> list[dict[str, object]]:
        """Per task: its id and kind, each sample's correctness and reward, its tool calls (summed over samples)
        and failed samples: what a paired task-level comparison of two runs is computed from."""
        out: list[dict[str, object]] = []
        for g in self.groups:
            rewards, correct = episode_outcomes(g.trajectories)
            out.append({
                "task": g.task.id, "kind": str(g.task.metadata.get("kind", g.task.ability)),
                "correct": [c == 1.0 for c in correct], "reward": [round(float(r), 6) for r in rewards],
                "tool_calls": sum(t.num_tool_calls for t in g), "failed": sum(t.failed for t in g),
            })  # fmt: skip
        return out

    def as_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        m = {
            f"{prefix}accuracy": self.accuracy,
            f"{prefix}reward": self.reward,
            f"{prefix}tool_calls": self.tool_calls,
            f"{prefix}tokens": self.tokens,
            f"{prefix}failed": float(self.failed),
        }
        m.update({f"{prefix}pass@{k}": v for k, v in self.pass_at.items()})
        m.update({f"{prefix}accuracy/{k}": v for k, v in self.by_kind.items()})
        m.update(self.tool_stats.metrics(prefix))
        return m


def summarize(groups: Sequence[Group]) -> EvalReport:
    """Aggregate groups of samples (one group per task) into a report."""
    if not groups:
        return EvalReport(0.0, {}, 0.0, 0.0, 0.0, 0)
    # samples are episodes, however many trajectories each recorded (an agent's sub-calls through the endpoint)
    outcomes = [episode_outcomes(g.trajectories) for g in groups]
    correct = [[c == 1.0 for c in ok] for _, ok in outcomes]
    n = min(len(c) for c in correct)
    pass_at = {k: float(np.mean([pass_at_k(len(c), sum(c), k) for c in correct])) for k in range(1, n + 1)}
    trajs = [t for g in groups for t in g]
    kinds: dict[str, list[bool]] = defaultdict(list)
    for g, c in zip(groups, correct):
        kinds[str(g.task.metadata.get("kind", g.task.ability))] += c
    return EvalReport(
        accuracy=float(np.mean([x for c in correct for x in c])),
        pass_at=pass_at,
        reward=float(np.mean([r for rewards, _ in outcomes for r in rewards])),
        tool_calls=float(np.mean([sum(t.num_tool_calls for t in g) / len(c) for g, c in zip(groups, correct)])),
        tokens=float(np.mean([t.num_policy_tokens for t in trajs])),
        failed=sum(t.failed for t in trajs),
        by_kind={k: float(np.mean(v)) for k, v in sorted(kinds.items())},
        n_tasks=len(groups),
        n_samples=sum(len(c) for c in correct),
        tool_stats=ToolStats.of(trajs),
        groups=list(groups),
    )


async def sample_group(policy: Policy, make_env: MakeEnv, task: Task, samples: int, params: SamplingParams, seed: int,
                       rollout: RolloutConfig | None = None, sampler: Any = None) -> Group:  # fmt: skip
    """`samples` independent episodes of `task` over `make_env`, or the group `sampler` grows instead (the user's
    agent's: `Runtime.agent_sampler`, whose runs have no episode env)."""
    from agentenv.rollout import run_group

    if sampler is not None:
        return cast(Group, await sampler.sample(policy, make_env, task, params, seed))
    return await run_group(policy, make_env, task, samples, params, seed=seed, config=rollout)


async def evaluate(
    policy: Policy,
    make_env: MakeEnv,
    tasks: Sequence[Task],
    *,
    samples: int,
    params: SamplingParams,
    seed: int,
    concurrency: int = 64,
    rollout: RolloutConfig | None = None,
    sampler: Any = None,
) -> EvalReport:
    """Roll out `samples` independent episodes per task and summarize (`rollout`: the run's per-trajectory limits;
    `sampler`: one that grows each task's group instead, e.g. a user's agent's)."""
    sem = asyncio.Semaphore(max(1, concurrency // max(1, samples)))

    async def one(i: int, task: Task) -> Group:
        async with sem:
            return await sample_group(policy, make_env, task, samples, params, seed * 1_000_003 + i * 7919, rollout, sampler)

    groups = await gather_settled(*(one(i, t) for i, t in enumerate(tasks)))
    return summarize(groups)
