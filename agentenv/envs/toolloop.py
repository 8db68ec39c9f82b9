"""Tool calls on an event loop of their own, so a tool that blocks cannot freeze the rollout.

A tool is a coroutine, and a coroutine that blocks (`time.sleep`, a CPU-bound
parse, a synchronous HTTP client) holds up every coroutine of its loop: in the
rollout's loop, every other episode's generation and its own timeout, which
cannot fire while the loop is stuck. So tool calls run on a loop in a daemon
thread; the caller awaits them from its own loop and enforces the timeout
there, where no tool code runs.

A blocking tool still holds up the other tool calls on the tool loop while it
blocks (they time out as results the model reads). When the tool loop has not
ticked for `STALL_S`, the next call starts a fresh tool loop; the stalled one
finishes what it holds once it unblocks, then stops.

Tools must tolerate being called from a loop other than the one they were
built on; every agentenv tool does (per-loop HTTP sessions, the sandbox's own
I/O thread), as `asyncio.run` per step already demanded.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agentenv._loops import HeartbeatLoopThread
from agentenv.errors import ToolError

T = TypeVar("T")

STALL_S = 0.5
"""A tool loop that has not ticked for this long is blocked: new calls go to a fresh one."""
_TICK_S = 0.1


class ToolLoops:
    """Hands out the current tool loop, replacing it when it has stalled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: HeartbeatLoopThread | None = None
        self.started = 0
        """Tool loops started in this process (more than 1 means a tool blocked one)."""

    def current(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            cur = self._current
            if cur is None or cur.stalled_s() > STALL_S:
                if cur is not None:
                    cur.retired = True
                self.started += 1
                cur = self._current = HeartbeatLoopThread(f"agentenv-tools-{self.started}", _TICK_S)
            return cur.loop

    def _forget(self) -> None:  # in a forked child: the parent's threads do not exist here
        self._lock = threading.Lock()
        self._current = None


LOOPS = ToolLoops()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=LOOPS._forget)


async def run_on_tool_loop(call: Callable[[], Awaitable[T]], timeout_s: float | None, what: str) -> T:
    """Await `call()` on the tool loop, with the timeout kept by the caller's loop.

    Args:
        call: Makes the awaitable (called on the tool loop, so even a
            synchronous `__call__` that blocks runs there).
        timeout_s: Wall-clock limit; None for none.
        what: Names the tool in errors ("the python tool").

    Raises:
        TimeoutError: `timeout_s` passed; the call is cancelled on the tool loop.
        ToolError: The tool raised `CancelledError` without being cancelled
            (a bug in the tool; a bare CancelledError would look like the
            caller's own cancellation and abort far more than this call).
        Exception: Whatever the tool raised.
    """
    fut = asyncio.run_coroutine_threadsafe(_guarded(call, what), LOOPS.current())
    return await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)


async def _guarded(call: Callable[[], Awaitable[Any]], what: str) -> Any:
    try:
        return await call()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the caller cancelled (its timeout, or its own cancellation)
        raise ToolError(f"{what} raised CancelledError without being cancelled (a bug in the tool)") from None
