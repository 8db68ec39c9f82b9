"""The `browse` tool: query forms, config validation, cache, fork and close."""

from __future__ import annotations

import asyncio

import pytest

from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.tools.base import Tool
from agentenv.tools.browser import BrowserConfig, BrowserTool, PageError, make_browser_tool, parse_query
from agentenv.tools.search.cache import SearchCache


@pytest.mark.parametrize(
    "query,url,goal",
    [
        ("https://a.org/x | when was it built", "https://a.org/x", "when was it built"),
        ("  https://a.org/x|goal  ", "https://a.org/x", "goal"),
        ("https://a.org/x when was it built", "https://a.org/x", "when was it built"),
        ("https://a.org/x", "https://a.org/x", ""),
        ("<https://a.org/x> | g", "https://a.org/x", "g"),
        ('{"url": "https://a.org/x", "goal": "the  date"}', "https://a.org/x", "the date"),
        ('{"url": "https://a.org/x"}', "https://a.org/x", ""),
    ],
)
def test_query_forms(query, url, goal):
    assert parse_query(query) == (url, goal)


@pytest.mark.parametrize(
    "query,msg",
    [
        ("", "Empty browse query"),
        ("   ", "Empty browse query"),
        ("| just a goal", "has no url"),
        ('{"url": 3}', 'needs a "url" string'),
        ('{"goal": "x"}', 'needs a "url" string'),
        ('{"url": "https://a.org", "goal": 1}', '"goal" must be a string'),
        ('{"url": "https://a.org"', "not valid JSON"),
        ("x" * 5000, "too long"),
    ],
)
async def test_malformed_query_is_a_readable_result(query, msg):
    tool = BrowserTool()
    r = await tool(query)
    assert not r.ok and msg in r.error and r.metadata["reason"] == "bad_query"
    if "JSON" in msg or "url" in msg:
        assert "<browse>URL | goal</browse>" in r.error  # the error teaches the format


@pytest.mark.parametrize(
    "query,msg",
    [
        ("Eiffel Tower height", "'Eiffel' is not a url"),  # refused before any DNS lookup
        ("http://exa mple.com/ | g", "not a valid url"),
        ("mailto:someone@example.com", "only http and https"),
        ("http:///path", "not a valid url"),
    ],
)
async def test_bad_urls_are_readable_results(query, msg):
    tool = BrowserTool()
    r = await tool(query)
    assert not r.ok and msg in r.error and r.metadata["reason"] == "bad_url"


def test_tool_protocol_and_name():
    tool = BrowserTool()
    assert isinstance(tool, Tool) and tool.name == "browse"


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"timeout_s": 0}, "browse.timeout_s"),
        ({"read_timeout_s": 60.0, "timeout_s": 30.0}, "browse.timeout_s"),
        ({"max_bytes": 10}, "browse.max_bytes"),
        ({"max_redirects": -1}, "browse.max_redirects"),
        ({"passage_chars": 50}, "browse.passage_chars"),
        ({"allow_hosts": "127.0.0.1"}, "browse.allow_hosts"),
        ({"allow_hosts": ("10.0.0.0/33",)}, "browse.allow_hosts"),
        ({"summary_max_tokens": 0}, "browse.summary_max_tokens"),
        ({"cache": True}, "browse.cache"),
    ],
)
def test_config_errors_name_the_key_and_value(kwargs, key):
    with pytest.raises(ConfigError) as e:
        BrowserConfig(**kwargs)
    assert e.value.key == key
    shown = [x for v in kwargs.values() for x in (v if isinstance(v, tuple) else (v,))]
    assert any(str(x) in str(e.value) for x in shown)


def test_options_suggest_the_closest_key():
    with pytest.raises(ConfigError, match="did you mean 'max_bytes'") as e:
        build_dataclass(BrowserConfig, {"max_byte": 10}, "env.tools.browse")
    assert e.value.key == "env.tools.browse.max_byte"
    with pytest.raises(ConfigError) as e:
        build_dataclass(BrowserConfig, {"timeout_s": -1}, "env.tools.browse")
    assert e.value.key == "env.tools.browse.timeout_s"
    tool = make_browser_tool({"allow_hosts": ["127.0.0.1"]}, passage_chars=1000)
    assert tool.config.allow_hosts == ("127.0.0.1",) and tool.config.passage_chars == 1000


async def test_pages_are_cached_across_tools(site, cfg, tmp_path):
    cache = SearchCache(tmp_path / "pages.sqlite")
    a = BrowserTool(cfg, cache=cache)
    r1 = await a(site.url("/article") + " | height")
    r2 = await a(site.url("/article") + " | completed")  # another goal, same page
    assert r1.ok and r2.ok
    assert (r1.metadata["cache"], r2.metadata["cache"]) == ("miss", "hit")
    assert site.hits["/article"] == 1
    assert "330 metres" in r2.text and r2.metadata["final_url"] == site.url("/article")
    assert (await a(site.url("/article#History"))).metadata["cache"] == "hit"  # same page
    # Errors are not cached: the next call tries again.
    await a(site.url("/missing"))
    await a(site.url("/missing"))
    assert site.hits["/missing"] == 2
    await a.aclose()
    # A second tool (another process, say) reads the same file.
    b = BrowserTool(cfg, cache=SearchCache(tmp_path / "pages.sqlite"))
    r3 = await b(site.url("/article"))
    assert r3.metadata["cache"] == "hit" and site.hits["/article"] == 1
    await b.aclose()


async def test_cache_switch_in_config(site, cfg, tmp_path):
    import dataclasses

    db = tmp_path / "tools.sqlite"
    tool = BrowserTool(dataclasses.replace(cfg, cache=str(db)))
    r = await tool(site.url("/plain"))
    assert r.metadata["cache"] == "miss" and db.exists()
    assert (await tool(site.url("/plain"))).metadata["cache"] == "hit"
    await tool.aclose()


async def test_fork_shares_the_pool_and_only_the_prototype_closes_it(site, cfg):
    proto = BrowserTool(cfg)
    fork = proto.fork()
    assert fork is not proto and fork.fetcher is proto.fetcher
    assert (await fork(site.url("/article"))).ok
    await fork.aclose()  # an episode ended: the shared pool stays open
    assert (await proto(site.url("/plain"))).ok
    (session,) = proto.fetcher.sessions.sessions()
    await proto.aclose()
    assert session.closed


def test_sync_callers_get_a_session_per_event_loop(threaded_site, cfg):
    tool = BrowserTool(cfg)
    for _ in range(2):  # each asyncio.run is a fresh loop
        r = asyncio.run(tool(threaded_site + "/page"))
        assert r.ok and "served from a thread" in r.text, r.error
    assert len(tool.fetcher.sessions.sessions()) == 1  # the dead loop's session was dropped


@pytest.fixture
def threaded_site():
    """A one-page site served by its own loop in a thread, for callers that run their own loops."""
    import socket
    import threading

    from aiohttp import web

    async def page(request):
        return web.Response(text="A page served from a thread.", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/page", page)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.SockSite(runner, sock).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


async def test_page_error_carries_a_reason():
    e = PageError("timeout", "slow")
    assert e.reason == "timeout" and str(e) == "slow"


def test_config_import_stays_light():
    import subprocess
    import sys

    code = (
        "import sys; from agentenv.tools.browser import BrowserConfig; BrowserConfig(); "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'trafilatura', 'torch', 'pypdf')]; "
        "assert not heavy, heavy"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


async def test_selection_reads_a_bounded_start_of_a_huge_page(monkeypatch):
    """A 4 MiB page cost 5.7 s and 121 MiB in select_passage: it reads at most select_max_chars of it."""
    from agentenv.tools.browser import tool as tool_module
    from agentenv.tools.browser.page import Page

    needle = "The Zephyr observatory's launch code is 7731-ALPHA."
    text = "River market season. " * 500 + needle + " " + "Harbor bridge village. " * 190_000  # 4.4 MB
    page = Page(url="https://ex.org/big", final_url="https://ex.org/big", title="Big", text=text,
                content_type="text/html", encoding="utf-8", num_bytes=len(text), truncated=False)  # fmt: skip
    tool = BrowserTool(BrowserConfig(select_max_chars=100_000))

    async def read(url):
        return page, False

    seen: list[int] = []
    select = tool_module.select_passage

    def spy(text, goal, budget):
        seen.append(len(text))
        return select(text, goal, budget)

    monkeypatch.setattr(tool, "read", read)
    monkeypatch.setattr(tool_module, "select_passage", spy)
    try:
        d = await tool.digest("https://ex.org/big", "Zephyr launch code")
    finally:
        await tool.aclose()
    assert seen == [100_000]  # the whole 4.4 MB page was selected from
    assert needle in d.body and d.body.endswith(" [...]") and d.metadata["page_chars"] == len(text)
    assert BrowserConfig().select_max_chars == 500_000
    with pytest.raises(ConfigError, match="browse.select_max_chars"):
        BrowserConfig(passage_chars=6000, select_max_chars=1000)  # less than the passage it selects
