"""The shared SQLite cache: keys, TTL, the cached tool, several writer processes, SIGKILL mid-write."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agentenv.tools.search import CachedSearchTool, SearchCache, SearchToolConfig, make_search_tool
from agentenv.tools.search.cache import cache_key


def test_put_get_and_key_covers_provider_query_params(tmp_path):
    c = SearchCache(tmp_path / "c.sqlite")
    c.put("bing", "q", {"k": 10}, "text", {"urls": ["u"]})
    assert c.get("bing", "q", {"k": 10}).text == "text"
    assert c.get("bing", "q", {"k": 10}).metadata == {"urls": ["u"]}
    assert c.get("bing", "q", {"k": 5}) is None
    assert c.get("searxng", "q", {"k": 10}) is None
    assert c.get("bing", "Q", {"k": 10}) is None
    assert cache_key("p", "q", {"a": 1, "b": 2}) == cache_key("p", "q", {"b": 2, "a": 1})
    assert c.stats() == {"hits": 2, "misses": 3, "hit_rate": 0.4}
    assert len(c) == 1


def test_ttl_expires_entries(tmp_path):
    c = SearchCache(tmp_path / "c.sqlite", ttl_s=0.05)
    c.put("p", "q", {}, "t", {})
    assert c.get("p", "q", {}) is not None
    time.sleep(0.1)
    assert c.get("p", "q", {}) is None


class CountingTool:
    name = "search"
    provider = "fake"
    cache_params = {"k": 3}

    def __init__(self):
        self.calls = 0

    async def __call__(self, query):
        from agentenv.types import ToolResult

        self.calls += 1
        if query == "fail":
            return ToolResult(text="", ok=False, error="boom")
        return ToolResult(text=f"Page 1: {query}\nbody", metadata={"num_results": 1})

    def fork(self):
        return self

    async def aclose(self):
        pass


async def test_cached_tool_hits_after_first_call_and_skips_errors(tmp_path):
    inner = CountingTool()
    tool = CachedSearchTool(inner, SearchCache(tmp_path / "c.sqlite"))
    r1 = await tool("alpha ")
    r2 = await tool.fork()("alpha")
    assert r1.text == r2.text == "Page 1: alpha\nbody"
    assert (r1.metadata["cache"], r2.metadata["cache"]) == ("miss", "hit")
    assert r2.metadata["num_results"] == 1 and inner.calls == 1
    assert not (await tool("fail")).ok and not (await tool("fail")).ok
    assert inner.calls == 3  # errors are never cached
    assert tool.metrics() == {
        "search/cache_hits": 1, "search/cache_misses": 3, "search/cache_hit_rate": 0.25, "search/cache_coalesced": 0
    }
    # A second process's view (a fresh SearchCache on the same file) sees the entry.
    assert SearchCache(tmp_path / "c.sqlite").get("fake", "alpha", {"k": 3}).text == r1.text


async def test_make_search_tool_with_cache_over_bing(provider, tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTENV_BING_KEY", raising=False)
    provider.script = [provider.ok(provider.bing_payload(2))]
    cfg = SearchToolConfig(provider="bing", endpoint=provider.url, api_key="k", cache=str(tmp_path / "s.sqlite"))
    tool = make_search_tool(cfg)
    a, b = await tool("same query"), await tool("same query")
    assert a.text == b.text and b.metadata["cache"] == "hit"
    assert len(provider.requests) == 1
    await tool.aclose()
    # Another market is another key.
    tool2 = make_search_tool(SearchToolConfig(provider="bing", endpoint=provider.url, api_key="k", market="fr-FR",
                                              cache=str(tmp_path / "s.sqlite")))
    await tool2("same query")
    assert len(provider.requests) == 2
    await tool2.aclose()


async def test_concurrent_misses_share_one_provider_call(provider, tmp_path):
    provider.script = [provider.delayed(0.2, provider.bing_payload(2))]
    cfg = SearchToolConfig(provider="bing", endpoint=provider.url, api_key="k", cache=str(tmp_path / "s.sqlite"))
    proto = make_search_tool(cfg)
    results = await asyncio.gather(*(proto.fork()("group query") for _ in range(5)))
    assert len(provider.requests) == 1
    assert len({r.text for r in results}) == 1 and all(r.ok for r in results)
    assert sorted(r.metadata["cache"] for r in results) == ["coalesced"] * 4 + ["miss"]
    assert proto.metrics()["search/cache_coalesced"] == 4 and proto.metrics()["search/requests"] == 1
    # A waiter that times out does not cancel the call the others share.
    provider.script = [provider.delayed(0.3, provider.bing_payload(1))]
    impatient = asyncio.create_task(asyncio.wait_for(proto.fork()("other"), 0.05))
    patient = asyncio.create_task(proto.fork()("other"))
    with pytest.raises(asyncio.TimeoutError):
        await impatient
    assert (await patient).ok and len(provider.requests) == 2
    await proto.aclose()


WRITER = textwrap.dedent(
    """
    import hashlib, sys
    from agentenv.tools.search.cache import SearchCache
    path, worker, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = SearchCache(path)
    print("ready", flush=True)
    i = 0
    while n < 0 or i < n:
        q = f"{worker}-{i}"
        # The text is derived from the query, so a reader can tell a torn entry from a whole one.
        body = hashlib.sha256(q.encode()).hexdigest() * (size // 64)
        c.put("prov", q, {"k": 10}, body, {"worker": worker, "i": i})
        i += 1
    """
)

READER = textwrap.dedent(
    """
    import hashlib, json, sqlite3, sys
    from agentenv.tools.search.cache import SearchCache
    path = sys.argv[1]
    c = SearchCache(path)
    conn = c._conn()
    ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
    rows = conn.execute("SELECT query, text, metadata FROM results").fetchall()
    bad = [q for q, t, m in rows if t != hashlib.sha256(q.encode()).hexdigest() * (len(t) // 64) or not t
           or json.loads(m)["worker"] != q.split("-")[0]]
    got = c.get("prov", rows[0][0], {"k": 10}) if rows else None
    c.put("prov", "after-crash", {"k": 10}, "still writable", {})
    print(json.dumps({"integrity": ok, "rows": len(rows), "bad": bad, "get": got is not None,
                      "after": c.get("prov", "after-crash", {"k": 10}).text}))
    """
)


def _python(script: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, **kw)


def test_sigkill_mid_write_leaves_cache_readable(tmp_path):
    db = str(tmp_path / "cache.sqlite")
    # Two writers, 200 KB entries: most of their time is spent inside a write.
    writers = [_python(WRITER, db, f"w{j}", "-1", str(200_000)) for j in range(2)]
    for w in writers:
        assert w.stdout.readline().strip() == "ready"
    time.sleep(0.6)
    for w in writers:
        os.kill(w.pid, signal.SIGKILL)
        w.wait(10)
        w.stdout.close()
        assert w.returncode == -signal.SIGKILL
    reader = _python(READER, db)
    out, _ = reader.communicate(timeout=60)
    report = json.loads(out)
    assert report["integrity"] == "ok"
    assert report["rows"] > 0 and report["bad"] == []
    assert report["get"] and report["after"] == "still writable"


def test_concurrent_writer_processes_lose_nothing(tmp_path):
    db = str(tmp_path / "cache.sqlite")
    n = 150
    writers = [_python(WRITER, db, f"p{j}", str(n), "2000") for j in range(3)]
    for w in writers:
        out, _ = w.communicate(timeout=60)
        assert w.returncode == 0, out
    c = SearchCache(db)
    assert len(c) == 3 * n
    assert c.get("prov", "p2-149", {"k": 10}).metadata == {"worker": "p2", "i": 149}


OPENER = textwrap.dedent(
    """
    import sys, time
    from agentenv.tools.search.cache import SearchCache
    start = float(sys.argv[2])
    time.sleep(max(0.0, start - time.time()))
    c = SearchCache(sys.argv[1])
    c.put("prov", sys.argv[3], {}, "x", {})
    print("ok", flush=True)
    """
)


def test_processes_opening_a_new_cache_at_once_all_succeed(tmp_path):
    # Switching a new file to WAL takes an exclusive lock, and SQLite answers "database is
    # locked" at once instead of waiting its busy timeout: rollout workers that start
    # together must still all open the shared cache.
    for attempt in range(3):
        db = str(tmp_path / f"cache{attempt}.sqlite")
        start = time.time() + 1.5  # after every interpreter has started
        openers = [_python(OPENER, db, str(start), f"q{j}", stderr=subprocess.PIPE) for j in range(8)]
        for o in openers:
            out, err = o.communicate(timeout=60)
            assert o.returncode == 0 and out.strip() == "ok", err[-2000:]
        assert len(SearchCache(db)) == 8


def test_unwritable_cache_path_is_a_tool_error(tmp_path):
    from agentenv.errors import ToolError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ToolError, match="search cache"):
        SearchCache(blocker / "sub" / "c.sqlite")
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ToolError, match="garbage.sqlite"):
        SearchCache(garbage)
