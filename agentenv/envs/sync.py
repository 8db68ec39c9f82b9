"""Run an env's coroutines for synchronous callers on one private event loop.

One loop per env (not `asyncio.run` per call) so that tools holding loop-bound
resources (aiohttp sessions, subprocess pipes) keep working from step to step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from agentenv._loops import refuse_inside_loop, running_loop

_R = TypeVar("_R")


class SyncRunner:
    """Runs coroutines to completion on a private loop; refuses inside a running loop.

    Args:
        owner: Class name used in error messages.
        async_name: The async method to point callers at (e.g. `astep`).
    """

    def __init__(self, owner: str, async_name: str):
        self._owner = owner
        self._async_name = async_name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[asyncio.Task[Any]] = set()

    def run(self, coro: Coroutine[Any, Any, _R], method: str = "step") -> _R:
        """Run `coro` to completion and return its result.

        Raises:
            RuntimeError: When an event loop is already running in this thread.
        """
        refuse_inside_loop(
            f"{self._owner}.{method}() was called inside a running event loop; "
            f"use `await env.{self._async_name}(...)` there instead",
            coro,
        )
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def run_or_schedule(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` now, or, inside a running loop, schedule it as a task on that loop."""
        loop = running_loop()
        if loop is None:
            self.run(coro, method="close")
            return
        task = loop.create_task(coro)
        self._pending.add(task)  # keep a reference until it finishes
        task.add_done_callback(self._pending.discard)

    def close(self) -> None:
        """Close the private loop (if one was made and no loop is running here)."""
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
