"""Faults inside one trajectory cost that trajectory, never its group or the batch.

A tool that raises `CancelledError` on its own, a policy that does, a tool
that blocks its thread with `time.sleep`: each is recorded as a failed
trajectory (masked from the loss) or a result the model reads, on time, while
the other episodes go on. Only a real cancellation of the caller propagates.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from agentenv.algorithms.arpo import ARPOConfig, TreeSampler
from agentenv.envs.agent_env import AgentEnv
from agentenv.envs.results import call_tool
from agentenv.envs.testing import CounterTool, EchoTool, boxed_reward, make_task
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import RolloutConfig, run_group
from agentenv.types import SamplingParams, ToolResult

PARAMS = SamplingParams(max_tokens=64)
TURNS = ["<search>capital</search>", "<answer>\\boxed{42}</answer>"]


class CancellingTool:
    """Raises CancelledError (nobody cancelled it) on its first `bad` calls, then echoes."""

    def __init__(self, name: str = "search", bad: int = 1):
        self.name, self.bad, self.calls = name, bad, 0

    async def __call__(self, query: str) -> ToolResult:
        self.calls += 1
        if self.calls <= self.bad:
            raise asyncio.CancelledError()
        return ToolResult(text=f"echo: {query}")

    def fork(self):
        return self

    async def aclose(self) -> None:
        return None


class BlockingTool:
    """Blocks its thread (a sync client inside a coroutine) for `block_s`."""

    def __init__(self, name: str = "python", block_s: float = 3.0):
        self.name, self.block_s = name, block_s

    async def __call__(self, query: str) -> ToolResult:
        time.sleep(self.block_s)
        return ToolResult(text="done")

    def fork(self):
        return self

    async def aclose(self) -> None:
        return None


class CancellingPolicy(ScriptedPolicy):
    """Raises CancelledError (a library bug, not a cancellation) on its `nth` generate call."""

    def __init__(self, tokenizer, turns, nth: int):
        super().__init__(tokenizer, turns)
        self.nth = nth

    async def generate(self, prompt_ids, params):
        gen = await super().generate(prompt_ids, params)
        if self.calls == self.nth:
            raise asyncio.CancelledError()
        return gen


def factory(tok, tools_fn, **cfg):
    config = {"max_context_tokens": 1024, "max_result_tokens": 64, **cfg}
    return lambda: AgentEnv(tools_fn(), tok, reward_fn=boxed_reward, config=config)


async def test_a_tool_raising_cancelled_error_fails_one_trajectory_not_the_group(tok):
    tool = CancellingTool(bad=1)
    group = await run_group(ScriptedPolicy(tok, TURNS), factory(tok, lambda: [tool]), make_task(), 4, PARAMS, seed=0)
    failed = [t for t in group if t.failed]
    assert len(group) == 4 and len(failed) == 1 and group.info["failed"] == 1
    assert "CancelledError" in failed[0].error and failed[0].finish_reason == "error"
    assert all(t.reward == 1.0 for t in group if not t.failed)
    assert sum(failed[0].loss_mask) == 0


async def test_a_tool_raising_cancelled_error_in_an_arpo_tree(tok):
    tool = CancellingTool(bad=2)
    cfg = ARPOConfig(group_size=6, initial_rollouts=2, forks_per_branch=2)
    sampler = TreeSampler(cfg, RolloutConfig(episode_timeout_s=30))
    group = await sampler.sample(ScriptedPolicy(tok, TURNS), factory(tok, lambda: [tool]), make_task(), PARAMS, seed=1)
    assert len(group) == 6
    failed = [t for t in group if t.failed]
    assert 1 <= len(failed) <= 2 and all("CancelledError" in t.error for t in failed)
    assert any(not t.failed and t.reward == 1.0 for t in group)


async def test_a_policy_raising_cancelled_error_fails_one_trajectory(tok):
    policy = CancellingPolicy(tok, TURNS, nth=2)
    group = await run_group(policy, factory(tok, lambda: [EchoTool("search")]), make_task(), 3, PARAMS, seed=0)
    failed = [t for t in group if t.failed]
    assert len(failed) == 1 and "CancelledError" in failed[0].error
    assert sum(not t.failed for t in group) == 2


@pytest.mark.parametrize("after_s", [0.001, 0.01, 0.05, 0.3])
async def test_a_real_cancellation_still_propagates_and_closes_the_tools(tok, after_s):
    """run_group raises the cancellation only once every episode has closed its tools (asyncio.gather
    alone returns at the first cancelled child, while its sibling is still closing: this failed 40 times
    in 200)."""
    for _ in range(5):
        proto = CounterTool("search")
        slow = ScriptedPolicy(tok, TURNS, delay_s=5.0)
        job = asyncio.create_task(run_group(slow, factory(tok, lambda proto=proto: [proto]), make_task(), 2, PARAMS, seed=0))
        await asyncio.sleep(after_s)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert len(proto.forks) == 2 and all(f.closed for f in proto.forks)


async def test_gather_settled_waits_for_every_child_before_raising():
    from agentenv._loops import gather_settled

    finished: list[str] = []

    async def child(name: str, fail_after: float | None) -> str:
        try:
            await asyncio.sleep(fail_after if fail_after is not None else 10)
            raise ValueError(name)
        finally:
            await asyncio.sleep(0.05)  # cleanup that itself awaits
            finished.append(name)

    with pytest.raises(ValueError, match="a"):
        await gather_settled(child("a", 0.01), child("b", None), child("c", None))
    assert sorted(finished) == ["a", "b", "c"]
    assert await gather_settled(asyncio.sleep(0, "x"), asyncio.sleep(0.01, "y")) == ["x", "y"]


async def test_a_blocking_tool_times_out_on_time_and_never_freezes_the_loop(tok):
    """`time.sleep(3)` in a tool with a 0.5 s timeout: the result says timeout after ~0.5 s, and the
    rollout's loop keeps ticking (another episode generates meanwhile)."""
    lags: list[float] = []

    async def heartbeat():
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.02)
            lags.append(time.perf_counter() - t0 - 0.02)

    beat = asyncio.create_task(heartbeat())
    tools = lambda: [BlockingTool("python", 3.0), EchoTool("search")]  # noqa: E731
    turns = lambda ids: ("<python>x</python>" if "slow" in tok.decode(ids) else "<search>q</search>")  # noqa: E731
    policy = ScriptedPolicy(tok, turns, delay_s=0.05)
    make_env = factory(tok, tools, tool_timeout_s=0.5, max_tool_calls=1)
    t0 = time.perf_counter()
    blocked, healthy = await asyncio.gather(
        run_group(policy, make_env, make_task("slow: what is 6 * 7?"), 1, PARAMS, seed=0),
        run_group(policy, make_env, make_task("fast: what is 6 * 7?", task_id="t1"), 1, PARAMS, seed=0),
    )
    elapsed = time.perf_counter() - t0
    beat.cancel()
    first_result = tok.decode(blocked.trajectories[0].segments[2].token_ids)
    assert "timed out after 0.5 s" in first_result
    assert max(lags) < 0.4, f"the rollout loop stalled {max(lags):.2f} s"
    assert elapsed < 2.5, elapsed
    assert not healthy.trajectories[0].failed


async def test_a_stalled_tool_loop_is_replaced_for_later_calls():
    from agentenv.envs.toolloop import LOOPS, STALL_S

    warm, _ = await call_tool(EchoTool("search"), "warm", timeout_s=10.0)  # a tool loop that answers
    assert warm.ok
    before = LOOPS.started
    blocked, _ = await call_tool(BlockingTool("python", STALL_S + 3.0), "x", timeout_s=0.3)
    assert blocked.error == "timeout"
    await asyncio.sleep(STALL_S + 0.5)  # the tool loop is still blocked; ours is not
    t0 = time.perf_counter()
    ok, _ = await call_tool(EchoTool("search"), "hello", timeout_s=1.0)
    assert ok.ok and ok.text == "echo: hello" and time.perf_counter() - t0 < 0.5
    assert LOOPS.started == before + 1
