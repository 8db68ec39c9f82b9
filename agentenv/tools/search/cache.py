"""A persistent query -> result cache shared by every search provider and process.

SQLite in WAL mode: readers never block writers, writers from several processes
queue on SQLite's lock (busy timeout), and every write is one transaction, so a
process killed mid-write leaves the last committed state readable (the WAL's
torn tail is ignored on the next open). Keys hash provider, query and the
parameters that shape the answer (k, cut, market, corpus hash, ...).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentenv.errors import ToolError
from agentenv.tools.base import HealthChecked, Tool, description_of, schema_of
from agentenv.types import HasMetrics, ToolResult

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key      TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    query    TEXT NOT NULL,
    params   TEXT NOT NULL,
    text     TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created  REAL NOT NULL
)
"""


@dataclass(frozen=True)
class CacheEntry:
    """One stored answer."""

    text: str
    metadata: dict[str, Any]
    created: float


def cache_key(provider: str, query: str, params: dict[str, Any]) -> str:
    """Stable key of (provider, query, params); params order does not matter."""
    blob = json.dumps([provider, query, params], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class SearchCache:
    """SQLite-backed store, one connection per thread and process.

    Args:
        path: Database file (created with its folder).
        ttl_s: Entries older than this many seconds are misses (None: never expire).
        busy_timeout_s: How long a writer waits for another process's write lock.
    """

    def __init__(self, path: str | Path, ttl_s: float | None = None, busy_timeout_s: float = 30.0):
        self.path = Path(path).expanduser()
        self.ttl_s = ttl_s
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn()
        except (OSError, sqlite3.Error) as e:
            raise ToolError(f"cannot open search cache {str(self.path)!r}: {e}. {_fix_hint(e)}") from e

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        # A forked child must not reuse its parent's connection.
        if conn is None or self._local.pid != os.getpid():
            conn = self._open()
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _open(self) -> sqlite3.Connection:
        # Switching a new file to WAL (and recovering one a killed writer left) takes an
        # exclusive lock, and SQLite reports "database is locked" at once instead of
        # waiting its busy timeout: processes opening the cache together retry until then.
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.005
        while True:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
                conn.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL mode: a killed process loses nothing committed; only
                # a power cut may drop the last transactions, never corrupt the file.
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute(_SCHEMA)
                return conn
            except sqlite3.OperationalError as e:
                conn.close()
                if "locked" not in str(e) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def get(self, provider: str, query: str, params: dict[str, Any]) -> CacheEntry | None:
        """The stored answer, or None (counts a hit or a miss).

        Raises:
            ToolError: The database cannot be read (names the file and how to fix it).
        """
        with self._errors("read"):
            row = self._conn().execute(
                "SELECT text, metadata, created FROM results WHERE key = ?", (cache_key(provider, query, params),)
            ).fetchone()
        if row is not None and self.ttl_s is not None and time.time() - row[2] > self.ttl_s:
            row = None
        with self._lock:
            if row is None:
                self.misses += 1
            else:
                self.hits += 1
        return None if row is None else CacheEntry(text=row[0], metadata=json.loads(row[1]), created=row[2])

    def put(self, provider: str, query: str, params: dict[str, Any], text: str, metadata: dict[str, Any]) -> None:
        """Store (or replace) an answer; one statement in autocommit mode is one transaction.

        Raises:
            ToolError: The database cannot be written (disk full, locked past the busy timeout, read-only).
        """
        row = (
            cache_key(provider, query, params),
            provider,
            query,
            json.dumps(params, sort_keys=True, default=str),
            text,
            json.dumps(metadata, default=str),
            time.time(),
        )
        with self._errors("write"):
            self._conn().execute(
                "INSERT OR REPLACE INTO results (key, provider, query, params, text, metadata, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise ToolError(
                f"search cache {str(self.path)!r}: {what} failed ({type(e).__name__}: {e}). {_fix_hint(e)}"
            ) from e

    def __len__(self) -> int:
        count: int = self._conn().execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return count

    def stats(self) -> dict[str, float]:
        """Hit and miss counts of this process, and the hit rate."""
        total = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hits / total if total else 0.0}

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _fix_hint(e: BaseException) -> str:
    """How to fix what SQLite (or the OS) reported, by its cause."""
    name = getattr(e, "sqlite_errorname", "")
    if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        return (
            "The file is not an intact SQLite database (corrupt, or another kind of file): "
            "delete it or point `cache` at another file."
        )
    if name == "SQLITE_FULL" or getattr(e, "errno", None) == 28:
        return "The disk is full: free space or point `cache` at another disk."
    if name in ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM") or isinstance(e, PermissionError):
        return "The file or its folder is not writable: fix the permissions or point `cache` at a writable file."
    if name == "SQLITE_BUSY":
        return "Another process holds the write lock too long: raise busy_timeout_s or give each run its own `cache` file."
    return "Check free disk space and permissions, or point `cache` at another file."


class SearchTool(Tool, Protocol):
    """A search tool a cache can key: its `provider` and what else decides its answers (`cache_params`)."""

    provider: str

    @property
    def cache_params(self) -> dict[str, Any]: ...

    def fork(self) -> SearchTool: ...


class CachedSearchTool:
    """Wraps a search tool: answers repeated queries from the cache.

    Only successful answers are stored (errors are retried next time). The inner
    tool's `provider` and `cache_params` make the key, so two providers, or the
    same provider with another k or cut, never share entries. Concurrent misses
    on one query (the G samples of a GRPO group often search the same words at
    once) share a single provider call.

    Args:
        tool: A search tool with `provider` and `cache_params` attributes.
        cache: The shared store.
    """

    def __init__(self, tool: SearchTool, cache: SearchCache, _shared: dict[str, Any] | None = None):
        self.tool = tool
        self.cache = cache
        self.name = tool.name
        self.description = description_of(tool)
        self.schema = schema_of(tool)
        self.provider = tool.provider
        self._params = dict(tool.cache_params)
        # In-flight fetches and counters, shared by every fork of this tool.
        self._shared: dict[str, Any] = _shared if _shared is not None else {"inflight": {}, "coalesced": 0}

    @property
    def cache_params(self) -> dict[str, Any]:
        return self._params

    async def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        q = query.strip()
        if not q:
            return await self.tool(query)  # the inner tool words the error
        entry = await asyncio.to_thread(self.cache.get, self.provider, q, self._params)
        if entry is not None:
            return ToolResult(
                text=entry.text, latency_s=time.perf_counter() - t0, metadata={**entry.metadata, "cache": "hit"}
            )
        loop = asyncio.get_running_loop()
        key = (id(loop), q)  # tasks belong to one loop
        inflight = self._shared["inflight"]
        task = inflight.get(key)
        joined = task is not None
        if joined:
            self._shared["coalesced"] += 1
        else:
            task = loop.create_task(self._fetch(q))
            inflight[key] = task
            task.add_done_callback(lambda _t: inflight.pop(key, None))
        # shield: one waiter's timeout must not cancel the call the others wait on.
        res: ToolResult = await asyncio.shield(task)
        return dataclasses.replace(
            res, latency_s=time.perf_counter() - t0, metadata={**res.metadata, "cache": "coalesced" if joined else "miss"}
        )

    async def _fetch(self, q: str) -> ToolResult:
        res = await self.tool(q)
        if res.ok:
            await asyncio.to_thread(self.cache.put, self.provider, q, self._params, res.text, res.metadata)
        return res

    def metrics(self) -> dict[str, float]:
        """`search/cache_hits`, `_misses`, `_hit_rate`, `_coalesced` (misses that joined a call in flight), and the inner tool's."""
        inner = self.tool.metrics() if isinstance(self.tool, HasMetrics) else {}
        ours = {f"search/cache_{k}": v for k, v in self.cache.stats().items()}
        ours["search/cache_coalesced"] = self._shared["coalesced"]
        return {**inner, **ours}

    async def health_check(self) -> None:
        """The wrapped tool's check, past the cache (a cached answer proves nothing about the provider)."""
        if isinstance(self.tool, HealthChecked):
            await self.tool.health_check()

    def fork(self) -> CachedSearchTool:
        return CachedSearchTool(self.tool.fork(), self.cache, self._shared)

    async def aclose(self) -> None:
        await self.tool.aclose()
