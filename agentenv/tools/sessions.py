"""One aiohttp session per event loop, for the tools that speak HTTP (browser fetch, summarizer, web search)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import aiohttp


@dataclass
class _Entry:
    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    slots: asyncio.Semaphore | None


class LoopSessions:
    """One aiohttp session per event loop, made on first use in that loop.

    An aiohttp session belongs to the loop it was made in, and a sync caller
    may run each call in a fresh loop (`asyncio.run`), so a tool keeps one per
    loop. A session whose loop has closed is dropped when the next one is made:
    it cannot be awaited closed any more, so its connector is marked closed
    (no warning about connections that died with the loop) and it is detached.

    Args:
        make: Builds a session; called inside the loop that will use it.
        concurrency: Requests in flight at once per loop, for callers that take
            a `slot()` around each request (None: no slots).
    """

    def __init__(self, make: Callable[[], aiohttp.ClientSession], concurrency: int | None = None):
        self._make = make
        self._concurrency = concurrency
        self._sessions: dict[int, _Entry] = {}

    def _entry(self) -> _Entry:
        loop = asyncio.get_running_loop()
        entry = self._sessions.get(id(loop))
        if entry is None or entry.loop is not loop or entry.session.closed:
            self._drop_dead_loops()
            slots = asyncio.Semaphore(self._concurrency) if self._concurrency is not None else None
            entry = self._sessions[id(loop)] = _Entry(loop, self._make(), slots)
        return entry

    def get(self) -> aiohttp.ClientSession:
        """The running loop's session (made now if it has none, or its last one was closed)."""
        return self._entry().session

    def slot(self) -> asyncio.Semaphore:
        """The running loop's limit on requests in flight (`async with sessions.slot():`)."""
        slots = self._entry().slots
        if slots is None:
            raise RuntimeError("LoopSessions(concurrency=None) has no slots")
        return slots

    def sessions(self) -> list[aiohttp.ClientSession]:
        """The sessions held now, one per loop."""
        return [entry.session for entry in self._sessions.values()]

    async def aclose(self) -> None:
        """Close the running loop's session; forget those of closed loops. Those of other live loops stay
        (their own loop closes them)."""
        self._drop_dead_loops()
        loop = asyncio.get_running_loop()
        for key, entry in list(self._sessions.items()):
            if entry.loop is loop:
                del self._sessions[key]
                if not entry.session.closed:
                    await entry.session.close()

    def _drop_dead_loops(self) -> None:
        for key in [k for k, entry in self._sessions.items() if entry.loop.is_closed()]:
            session = self._sessions.pop(key).session
            connector = session.connector
            if connector is not None:
                connector._close()  # the loop is gone: nothing to await, only to mark closed
            session.detach()
