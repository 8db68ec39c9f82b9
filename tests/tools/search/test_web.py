"""Bing v7 and SearXNG clients against servers on 127.0.0.1 that speak each wire format."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from agentenv.errors import ToolError
from agentenv.tools.base import Tool
from agentenv.tools.search import TokenBucket
from agentenv.tools.search.bing import BingSearchTool
from agentenv.tools.search.http import RetryPolicy
from agentenv.tools.search.searxng import SearxngSearchTool

FAST = RetryPolicy(timeout_s=0.5, max_retries=2, backoff_s=0.01, max_backoff_s=0.05, max_retry_after_s=5)


@pytest.fixture(autouse=True)
def no_env_credentials(monkeypatch):
    for var in ("AGENTENV_BING_KEY", "BING_SEARCH_V7_SUBSCRIPTION_KEY", "AGENTENV_BING_ENDPOINT",
                "AGENTENV_BING_MARKET", "AGENTENV_SEARXNG_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)


def bing(provider, **kw) -> BingSearchTool:
    kw.setdefault("retry", FAST)
    return BingSearchTool(api_key="k123", endpoint=provider.url, **kw)


async def test_bing_request_and_format(provider):
    provider.script = [provider.ok(provider.bing_payload(12))]
    tool = bing(provider, k=10, market="de-DE")
    assert isinstance(tool, Tool) and tool.name == "search"
    res = await tool("  capital of France ")
    assert res.ok
    req = provider.requests[0]
    assert req["path"] == "/v7.0/search"
    assert req["query"] == {"q": "capital of France", "count": "10", "mkt": "de-DE"}
    assert req["headers"]["Ocp-Apim-Subscription-Key"] == "k123"
    blocks = res.text.split("\n\n")
    assert len(blocks) == 10  # a server that sends more than count is cut to k
    assert blocks[0] == "Page 1: r0 title\nr0 snippet"
    assert blocks[9] == "Page 10: r9 title\nr9 snippet"
    assert res.metadata["urls"][0] == "https://ex.org/r0"
    await tool.aclose()


async def test_bing_snippet_cut_and_urls_shown(provider):
    payload = provider.bing_payload(1)
    payload["webPages"]["value"][0]["snippet"] = "x" * 1500
    provider.script = [provider.ok(payload)]
    tool = bing(provider, show_url=True)
    res = await tool("q")
    assert res.text == "Page 1: r0 title\nhttps://ex.org/r0\n" + "x" * 1000
    await tool.aclose()


async def test_bing_429_honours_retry_after(provider):
    provider.script = [provider.status(429, {"Retry-After": "1"}), provider.ok(provider.bing_payload(2))]
    tool = bing(provider)
    t0 = time.monotonic()
    res = await tool("q")
    assert res.ok and res.text.startswith("Page 1: r0 title")
    assert len(provider.requests) == 2
    assert time.monotonic() - t0 >= 0.95  # waited for Retry-After, not the 10 ms backoff
    await tool.aclose()


async def test_retry_after_beyond_limit_fails_fast(provider):
    provider.script = [provider.status(429, {"Retry-After": "3600"})]
    tool = bing(provider)
    t0 = time.monotonic()
    with pytest.raises(ToolError, match="Retry-After"):
        await tool("q")
    assert time.monotonic() - t0 < 1 and len(provider.requests) == 1
    await tool.aclose()


async def test_bing_500_then_success(provider):
    provider.script = [provider.status(500), provider.status(503), provider.ok(provider.bing_payload(3))]
    tool = bing(provider)
    res = await tool.fork()("q")
    assert res.ok and res.metadata["num_results"] == 3 and len(provider.requests) == 3
    m = tool.metrics()  # counted across forks
    assert (m["search/requests"], m["search/retries"], m["search/failures"]) == (3, 2, 0)
    await tool.aclose()


async def test_bing_hang_past_timeout_then_success(provider):
    provider.script = [provider.hang(5), provider.ok(provider.bing_payload(1))]
    tool = bing(provider)
    t0 = time.monotonic()
    res = await tool("q")
    assert res.ok and res.text == "Page 1: r0 title\nr0 snippet"
    assert 0.5 <= time.monotonic() - t0 < 3
    await tool.aclose()


async def test_bing_always_hanging_raises_tool_error(provider):
    provider.script = [provider.hang(5)]
    tool = bing(provider, retry=RetryPolicy(timeout_s=0.2, max_retries=1, backoff_s=0.01))
    with pytest.raises(ToolError, match="timed out after 0.2 s"):
        await tool("q")
    assert len(provider.requests) == 2
    await tool.aclose()


async def test_malformed_json_is_retried_then_a_clear_error(provider):
    provider.script = [provider.raw("{not json")]
    tool = bing(provider)
    with pytest.raises(ToolError, match="malformed response") as ei:
        await tool("q")
    assert "3 attempts" in str(ei.value) and len(provider.requests) == 3
    # Same fault, on_error="result": the model reads an error, the rollout goes on.
    tool2 = bing(provider, on_error="result")
    res = await tool2("q")
    assert not res.ok and "unavailable" in res.error and "malformed response" in res.metadata["infra_error"]
    await tool.aclose()
    await tool2.aclose()


async def test_malformed_then_valid_recovers(provider):
    provider.script = [provider.ok({"webPages": {"value": "oops"}}), provider.ok(provider.bing_payload(1))]
    tool = bing(provider)
    res = await tool("q")
    assert res.ok and res.metadata["num_results"] == 1
    await tool.aclose()


async def test_bing_empty_results_say_so(provider):
    provider.script = [provider.ok({"_type": "SearchResponse", "queryContext": {"originalQuery": "zzz"}})]
    tool = bing(provider)
    res = await tool("zzqx")
    assert res.ok and res.text.startswith("No results found for 'zzqx'") and res.metadata["num_results"] == 0
    provider.script = [provider.ok({"webPages": {"value": []}})]
    assert "No results found" in (await tool("zzqx")).text
    await tool.aclose()


def test_bing_missing_key_names_the_variable():
    with pytest.raises(ToolError, match="AGENTENV_BING_KEY") as ei:
        BingSearchTool(endpoint="http://127.0.0.1:9")
    assert "BING_SEARCH_V7_SUBSCRIPTION_KEY" in str(ei.value)


async def test_bing_key_and_endpoint_from_environment(provider, monkeypatch):
    monkeypatch.setenv("BING_SEARCH_V7_SUBSCRIPTION_KEY", "envkey")
    monkeypatch.setenv("AGENTENV_BING_ENDPOINT", provider.url + "/v7.0/search")
    provider.script = [provider.ok(provider.bing_payload(1))]
    tool = BingSearchTool(retry=FAST)
    assert "envkey" not in repr(tool)
    assert (await tool("q")).ok
    assert provider.requests[0]["headers"]["Ocp-Apim-Subscription-Key"] == "envkey"
    assert provider.requests[0]["query"]["mkt"] == "en-US"
    await tool.aclose()


async def test_bad_key_raises_even_in_result_mode(provider):
    provider.script = [provider.status(401, body='{"error": {"code": "InvalidAuthorization"}}')]
    tool = bing(provider, on_error="result")
    with pytest.raises(ToolError, match="HTTP 401.*AGENTENV_BING_KEY"):
        await tool("q")
    assert len(provider.requests) == 1  # not retried
    await tool.aclose()


async def test_rejected_query_is_a_result(provider):
    provider.script = [provider.status(400)]
    tool = bing(provider)
    res = await tool("q")
    assert not res.ok and "rejected" in res.error
    await tool.aclose()


async def test_empty_query_never_reaches_the_server(provider):
    res = await bing(provider)("   ")
    assert not res.ok and "Empty search query" in res.error and provider.requests == []


async def test_concurrency_limit(provider):
    provider.script = [provider.delayed(0.1, provider.bing_payload(1))]
    tool = bing(provider, concurrency=2)
    results = await asyncio.gather(*(tool.fork()(f"q{i}") for i in range(6)))
    assert all(r.ok for r in results)
    assert provider.max_in_flight == 2
    await tool.aclose()


async def test_rate_limit_shared_across_forks(provider):
    provider.script = [provider.ok(provider.bing_payload(1))]
    tool = bing(provider, limiter=TokenBucket(rate=20, burst=2))
    t0 = time.monotonic()
    await asyncio.gather(*(tool.fork()(f"q{i}") for i in range(6)))
    # burst 2 go at once, the other 4 wait one 50 ms slot each.
    assert time.monotonic() - t0 >= 0.19
    assert len(provider.requests) == 6
    await tool.aclose()


async def test_fork_shares_the_pool_and_only_the_prototype_closes_it(provider):
    provider.script = [provider.ok(provider.bing_payload(1))]
    tool = bing(provider)
    child = tool.fork()
    assert child is not tool and isinstance(child, Tool)
    await child("a")
    await child.aclose()
    assert (await tool("b")).ok and tool.sessions.sessions()  # the fork's aclose left the pool open
    (session,) = tool.sessions.sessions()
    await tool.aclose()
    assert session.closed


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_sync_callers_with_fresh_loops(provider_sync):
    tool = BingSearchTool(api_key="k", endpoint=provider_sync, retry=FAST)
    for _ in range(2):  # a sync caller may run each call in its own loop
        assert asyncio.run(tool("q")).ok
    asyncio.run(tool.aclose())
    assert tool.sessions.sessions() == []
    gc.collect()  # sockets of the dead loops are reclaimed here, not in a later test


@pytest.fixture
def provider_sync():
    """A provider served from a background thread, for callers that own their loops."""
    import threading

    from aiohttp import web

    ready = threading.Event()
    box = {}

    def serve():
        loop = asyncio.new_event_loop()
        app = web.Application()

        async def h(request):
            return web.json_response({"webPages": {"value": [{"name": "t", "url": "u", "snippet": "s"}]}})

        app.router.add_get("/v7.0/search", h)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        box["loop"], box["runner"] = loop, runner
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    ready.wait(10)
    yield box["url"]
    box["loop"].call_soon_threadsafe(box["loop"].stop)
    th.join(5)


# -- SearXNG -------------------------------------------------------------------


def searx(provider, **kw) -> SearxngSearchTool:
    kw.setdefault("retry", FAST)
    return SearxngSearchTool(endpoint=provider.url, **kw)


async def test_searxng_request_and_format(provider):
    provider.script = [provider.ok(provider.searxng_payload(3))]
    tool = searx(provider, k=2, language="en")
    res = await tool("open source search")
    req = provider.requests[0]
    assert req["path"] == "/search"
    assert req["query"] == {"q": "open source search", "format": "json", "language": "en"}
    assert res.text == "Page 1: s0 title\ns0 content\n\nPage 2: s1 title\ns1 content"
    await tool.aclose()


async def test_searxng_retries_and_errors(provider):
    provider.script = [provider.status(502), provider.hang(5), provider.ok(provider.searxng_payload(1))]
    tool = searx(provider)
    assert (await tool("q")).text == "Page 1: s0 title\ns0 content"
    assert len(provider.requests) == 3

    provider.requests.clear()
    provider.script = [provider.raw('{"results": 5}')]
    with pytest.raises(ToolError, match="malformed"):
        await tool("q")

    provider.script = [provider.ok({"query": "q", "results": []})]
    assert (await tool("q")).text.startswith("No results found")

    provider.script = [provider.status(403, body="Forbidden")]
    with pytest.raises(ToolError, match="settings.yml"):
        await tool("q")
    await tool.aclose()


def test_searxng_missing_endpoint_names_the_variable():
    with pytest.raises(ToolError, match="AGENTENV_SEARXNG_ENDPOINT"):
        SearxngSearchTool()


async def test_token_bucket_paces_calls():
    bucket = TokenBucket(rate=50, burst=1)
    t0 = time.monotonic()
    for _ in range(6):
        await bucket.acquire()
    assert 0.09 <= time.monotonic() - t0 < 0.5  # 5 intervals of 20 ms
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0)
