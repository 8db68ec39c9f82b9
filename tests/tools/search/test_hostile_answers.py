"""A search provider that answers with hostile bodies: every one is an error result or a ToolError, never a crash.

The providers are aiohttp servers on 127.0.0.1 (see conftest.py).
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
from aiohttp import web

from agentenv.errors import ToolError
from agentenv.tools.search.bing import BingSearchTool
from agentenv.tools.search.cache import CachedSearchTool, SearchCache
from agentenv.tools.search.config import SearchToolConfig, make_search_tool
from agentenv.tools.search.http import RetryPolicy
from agentenv.tools.search.searxng import SearxngSearchTool

FAST = RetryPolicy(timeout_s=5.0, max_retries=1, backoff_s=0.01, max_backoff_s=0.05)
DEEP = "[" * 200_000 + "]" * 200_000  # valid JSON, deeper than any recursion limit


def bing(provider, **kw) -> BingSearchTool:
    kw.setdefault("retry", FAST)
    return BingSearchTool(api_key="k123", endpoint=provider.url, **kw)


def huge(total: int, announce: bool):
    """A 200 with `total` bytes of JSON-looking filler, streamed in 1 MB chunks."""

    async def h(request):
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if announce:
            resp.content_length = total
        await resp.prepare(request)
        chunk = b" " * 1_000_000
        try:
            for _ in range(total // len(chunk)):
                await resp.write(chunk)
        except (ConnectionError, RuntimeError):
            pass  # the client hung up at its cap
        return resp

    return h


@pytest.mark.parametrize("on_error", ["raise", "result"])
async def test_deeply_nested_json_is_a_malformed_answer(provider, on_error):
    provider.script = [provider.raw('{"webPages": {"value": ' + DEEP + "}}")]
    tool = bing(provider, on_error=on_error)
    try:
        if on_error == "raise":
            with pytest.raises(ToolError, match="malformed response .*RecursionError"):
                await tool("q")
        else:
            res = await tool("q")
            assert not res.ok and "RecursionError" in res.metadata["infra_error"]
    finally:
        await tool.aclose()


async def test_deeply_nested_json_from_searxng(provider):
    provider.script = [provider.raw('{"results": ' + DEEP + "}")]
    tool = SearxngSearchTool(endpoint=provider.url, retry=FAST, on_error="result")
    try:
        res = await tool("q")
    finally:
        await tool.aclose()
    assert not res.ok and "malformed response" in res.metadata["infra_error"]


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "chunked"])
async def test_a_100_mb_body_is_not_read(provider, announce):
    provider.script = [huge(100_000_000, announce)]
    tool = bing(provider, on_error="result")  # the default cap: 4 MiB
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        res = await tool("q")
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        await tool.aclose()
    assert not res.ok and "oversized body" in res.metadata["infra_error"]
    assert "max_response_bytes" in res.metadata["infra_error"]
    assert peak < 20_000_000, f"peak {peak / 1e6:.0f} MB for a capped read"
    assert elapsed < 5.0
    assert len(provider.requests) == 1  # an oversized answer is not retried


def test_the_body_cap_is_a_validated_config_option():
    assert SearchToolConfig(provider="bing", max_response_bytes=1000).max_response_bytes == 1000
    with pytest.raises(Exception, match="search.max_response_bytes"):
        SearchToolConfig(provider="bing", max_response_bytes=0)
    tool = make_search_tool({"provider": "searxng", "endpoint": "http://127.0.0.1:9", "max_response_bytes": 1234})
    assert tool.max_response_bytes == 1234


async def test_null_titles_and_snippets_read_as_empty_not_none(provider):
    provider.script = [provider.ok({"webPages": {"value": [
        {"name": None, "url": "https://ex.org/a", "snippet": None},
        {"name": "Real title", "url": None, "snippet": "Real snippet"},
    ]}})]  # fmt: skip
    tool = bing(provider)
    try:
        res = await tool("q")
    finally:
        await tool.aclose()
    assert res.ok and "None" not in res.text, res.text
    assert res.text.startswith("Page 1: \n") and "Page 2: Real title\nReal snippet" in res.text


async def test_searxng_null_title(provider):
    provider.script = [provider.ok({"results": [{"title": None, "url": "https://ex.org/a", "content": "c"}]})]
    tool = SearxngSearchTool(endpoint=provider.url, retry=FAST)
    try:
        res = await tool("q")
    finally:
        await tool.aclose()
    assert res.ok and "None" not in res.text


def test_a_corrupt_cache_file_is_named_as_such_not_as_a_full_disk(tmp_path):
    path = tmp_path / "cache.sqlite"
    path.write_bytes(b"this is not a database " * 1000)
    with pytest.raises(ToolError) as ei:
        SearchCache(path)
    msg = str(ei.value)
    assert "not an intact SQLite database" in msg and "disk space" not in msg
    assert str(path) in msg


async def test_titles_and_urls_are_cut_like_snippets(provider):
    """10 results with 400 KB titles made a 4 MB result (a step stalled 13-20 s tokenizing it)."""
    provider.script = [provider.ok({"webPages": {"value": [
        {"name": "T" * 400_000, "url": "https://ex.org/" + "u" * 400_000, "snippet": "s" * 400_000} for _ in range(10)
    ]}})]  # fmt: skip
    tool = bing(provider, max_chars=1000, show_url=True, max_response_bytes=16 * 1024 * 1024)
    try:
        res = await tool("q")
    finally:
        await tool.aclose()
    assert res.ok and res.text.startswith("Page 1: " + "T" * 1000 + "\nhttps://ex.org/")
    assert len(res.text) <= 10 * (3 * 1000 + 20), len(res.text)


async def test_a_lone_surrogate_in_an_answer_reaches_the_model_as_text(provider, tmp_path):
    """JSON may escape a lone surrogate (`"\\ud800"`): the cache failed to store it (UnicodeEncodeError); it is U+FFFD."""
    provider.script = [provider.raw('{"webPages": {"value": [{"name": "abc \\ud800", "url": "https://ex.org/a", '
                                    '"snippet": "x\\u0000y"}]}}')]  # fmt: skip
    tool = CachedSearchTool(bing(provider), SearchCache(tmp_path / "cache.sqlite"))
    try:
        res = await tool("q")
        again = await tool("q")  # from the cache
    finally:
        await tool.aclose()
    assert res.ok and "Page 1: abc \ufffd\nx\ufffdy" in res.text and again.text == res.text
