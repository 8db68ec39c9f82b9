"""Held-out score of the tiny model: real episodes with the real tools, per task kind."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from agentenv.policies.base import Policy
from agentenv.tasks.task import Task
from agentenv.tools.base import Tool
from agentenv.types import SamplingParams, Tokenizer


async def evaluate_policy(
    policy: Policy,
    tasks: list[Task],
    tools: list[Tool],
    tokenizer: Tokenizer,
    *,
    temperature: float,
    max_turn_tokens: int,
    max_result_tokens: int,
    max_context_tokens: int,
    seed: int = 0,
) -> dict[str, Any]:
    """Run one episode per task; accuracy (reward's `correct`) per kind.

    Returns:
        `{"accuracy": {kind: share}, "format_ok": {kind: share}, "tool_calls": {kind: mean}, "n": {kind: count}}`.
    """
    from agentenv.rollout import RolloutConfig, RolloutEngine
    from agentenv.toy.tiny.traces import make_env

    engine = RolloutEngine(policy, RolloutConfig(generation_timeout_s=None, episode_timeout_s=3600.0))
    params = SamplingParams(max_tokens=max_turn_tokens, temperature=temperature)

    async def one(i: int, task: Task):
        env = make_env(tools, tokenizer, max_result_tokens, max_context_tokens)
        return task, await engine.run_episode(env, task, params, seed=seed * 100_003 + i)

    results = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    correct: dict[str, list[float]] = defaultdict(list)
    fmt: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, list[float]] = defaultdict(list)
    failed = 0
    for task, traj in results:
        kind = task.metadata.get("kind", "all")
        reward = traj.info.get("reward", {})
        correct[kind].append(float(bool(reward.get("correct", False))))
        fmt[kind].append(float(bool(reward.get("format_ok", False))))
        calls[kind].append(float(traj.num_tool_calls))
        failed += traj.failed
    mean = lambda xs: round(sum(xs) / len(xs), 4)  # noqa: E731 - a one-line helper local to this report
    return {
        "accuracy": {k: mean(v) for k, v in correct.items()},
        "format_ok": {k: mean(v) for k, v in fmt.items()},
        "tool_calls": {k: mean(v) for k, v in calls.items()},
        "n": {k: len(v) for k, v in correct.items()},
        "failed_episodes": failed,
    }
