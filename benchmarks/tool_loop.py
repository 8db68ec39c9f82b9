"""A tool that blocks its thread: the rollout loop's stall, tools awaited in the loop vs on the tool loop.

Usage: python benchmarks/tool_loop.py [--block-s 5] [--timeout-s 0.5] [--calls 2000]

Side by side in one process:
- in the loop: `asyncio.wait_for(tool(query), timeout)` on the rollout's own
  event loop (what `call_tool` did before);
- tool loop: `agentenv.envs.results.call_tool`, which runs the call on the
  tool loop and keeps the timeout on the caller's loop.

For a tool that calls `time.sleep(block_s)` inside its coroutine (a
synchronous client) with a `timeout_s` tool timeout, it measures when the
caller gets its result and the longest stall of a 10 ms heartbeat on the
rollout loop (the generation of every other episode waits that long); and for
a trivial async tool, the cost of one call. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from agentenv.envs.results import call_tool
from agentenv.types import ToolResult


class Blocking:
    name = "python"

    def __init__(self, block_s: float):
        self.block_s = block_s

    async def __call__(self, query: str) -> ToolResult:
        time.sleep(self.block_s)
        return ToolResult(text="done")


class Trivial:
    name = "search"

    async def __call__(self, query: str) -> ToolResult:
        return ToolResult(text=query)


async def in_loop(tool, query: str, timeout_s: float) -> ToolResult:
    try:
        return await asyncio.wait_for(tool(query), timeout_s)
    except TimeoutError:
        return ToolResult(text="", ok=False, error="timeout")


async def on_tool_loop(tool, query: str, timeout_s: float) -> ToolResult:
    return (await call_tool(tool, query, timeout_s))[0]


async def stall(call, block_s: float, timeout_s: float) -> tuple[float, float, str]:
    """(seconds until the caller has its result, longest heartbeat stall, the result's error)."""
    lags: list[float] = []

    async def heartbeat() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - t - 0.01)

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.1)
    t0 = time.perf_counter()
    res = await call(Blocking(block_s), "x", timeout_s)
    took = time.perf_counter() - t0
    await asyncio.sleep(block_s + 0.2)  # let a blocked tool loop drain before the next measurement
    beat.cancel()
    return took, max(lags), res.error or "ok"


async def per_call_us(call, n: int) -> float:
    tool = Trivial()
    await call(tool, "warm", 5.0)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call(tool, "q", 5.0)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


async def main(block_s: float, timeout_s: float, calls: int) -> None:
    rows = []
    for name, call in (("in the loop (before)", in_loop), ("tool loop (now)", on_tool_loop)):
        took, worst, error = await stall(call, block_s, timeout_s)
        us = await per_call_us(call, calls)
        rows.append((name, took, worst, error, us))
    print(f"A tool doing time.sleep({block_s:g}) in its coroutine, tool timeout {timeout_s:g} s:\n")
    print("| how tools are awaited | result after (s) | longest rollout-loop stall (s) | result | trivial call, median (us) |")
    print("|---|---:|---:|---|---:|")
    for name, took, worst, error, us in rows:
        print(f"| {name} | {took:.2f} | {worst:.2f} | {error} | {us:.0f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-s", type=float, default=5.0)
    ap.add_argument("--timeout-s", type=float, default=0.5)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    asyncio.run(main(args.block_s, args.timeout_s, args.calls))
