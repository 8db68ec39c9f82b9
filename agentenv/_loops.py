"""Event-loop plumbing shared by tools, envs and policies.

`LoopThread`: an event loop of its own in a daemon thread (the sandbox pool's
I/O, the vLLM engine, the tools' loop). `HeartbeatLoopThread` adds a heartbeat
so a caller can see that something blocked the loop, and retires itself once
drained. `refuse_inside_loop`: the one guard for synchronous entry points that
would block (or deadlock) a running event loop. `gather_settled`: `asyncio.gather`
that never returns while a child still runs its cleanup.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def refuse_inside_loop(message: str, coro: Coroutine[Any, Any, Any] | None = None) -> None:
    """Raise `RuntimeError(message)` when an event loop runs in this thread.

    Args:
        message: The error's text (names the sync method and its async twin).
        coro: A coroutine already made for the call; closed before raising so
            that it is not reported as never awaited.
    """
    if running_loop() is None:
        return
    if coro is not None:
        coro.close()
    raise RuntimeError(message)


async def gather_settled(*aws: Awaitable[T]) -> list[T]:
    """`asyncio.gather(*aws)`, except that it raises only once every child has finished.

    `asyncio.gather` raises as soon as one child is cancelled or fails, while
    the others may still be in their `finally` (an episode closing its
    sandbox): a caller that then shuts down its loop leaks what they held.
    Here, when the caller is cancelled or a child fails, the other children
    are cancelled and awaited to their end first; then the cancellation (or
    the first error) propagates.

    Returns:
        The children's results, in order.
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            if not t.done() and not t.cancelling():  # a second cancel would cut short its cleanup
                t.cancel()
        await asyncio.wait(tasks)
        raise


class LoopThread:
    """An event loop of its own, in a daemon thread.

    Args:
        name: The thread's name.
    """

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def in_loop(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return threading.current_thread() is self.thread

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Schedule `coro` on the loop; its result comes through the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run `coro` on the loop and block until it is done (never from the loop itself)."""
        if self.in_loop():
            coro.close()
            raise RuntimeError(f"blocking call from {self.thread.name}'s own event loop")
        return self.submit(coro).result(timeout)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Runs `fn(*args)` in the loop: now when called from it, else soon."""
        if self.in_loop():
            fn(*args)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, join_s: float = 5.0) -> None:
        """Stop the loop; from another thread, wait up to `join_s` and close it."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_loop():
            self.thread.join(join_s)
            if not self.thread.is_alive():
                self.loop.close()


class HeartbeatLoopThread(LoopThread):
    """A `LoopThread` with a heartbeat every `tick_s`; `stalled_s` shows a blocked loop.

    Once `retired`, the thread ends by itself after two ticks with no task left
    (a call submitted just before retirement has had its task created by then),
    and closes its loop.
    """

    def __init__(self, name: str, tick_s: float):
        self.tick_s = tick_s
        self.beat = time.monotonic()
        self.retired = False
        self._idle_ticks = 0
        super().__init__(name)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _tick(self) -> None:
        self.beat = time.monotonic()
        if self.retired:
            self._idle_ticks = self._idle_ticks + 1 if not asyncio.all_tasks(self.loop) else 0
            if self._idle_ticks >= 2:
                self.loop.stop()
                return
        self.loop.call_later(self.tick_s, self._tick)

    def stalled_s(self) -> float:
        """Seconds the heartbeat is overdue (negative while it is on time)."""
        return time.monotonic() - self.beat - self.tick_s
