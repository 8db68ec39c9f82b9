"""A page picks its charset: any name, however hostile, is a readable page or an error result, never a crash.

Each page is served over HTTP on 127.0.0.1 with `Content-Type: text/html;
charset=<name>` (or a `<meta charset>`) and read through the real browser.
"""

from __future__ import annotations

import tracemalloc
import zlib
from urllib.parse import quote

import pytest
from aiohttp import web

from agentenv.tools.browser import BrowserTool, FollowSearchTool
from agentenv.tools.browser.extract import decode_body
from agentenv.tools.search.searxng import SearxngSearchTool

from .conftest import start_site

PAGE = (
    "<html><head><title>Charset probe</title></head><body><article>"
    "<p>The lighthouse keeper logged 412 ships in the winter of 1911, a record for the harbor.</p>"
    "</article></body></html>"
)
# 200 MB of one letter, compressed to ~200 kB: what `charset=zlib` would inflate.
BOMB = zlib.compress(b"A" * 200_000_000, 9)

# Codec names Python accepts that are not document charsets, and names it does not know.
HOSTILE = ["utf-16", "utf-32", "zlib", "base64", "hex", "rot13", "bz2", "uu", "quopri", "punycode", "idna",
           "utf-7", "unicode_escape", "raw_unicode_escape", "undefined", "charmap", "zip", "uu_codec",
           "no-such-codec", "utf-8\x00", "'\"", ""]


def _routes(app: web.Application, site) -> None:
    async def declared(request):
        cs = request.query["cs"]
        body = BOMB if request.query.get("bomb") else PAGE.encode()
        return web.Response(body=body, headers={"Content-Type": f"text/html; charset={cs}"})

    async def meta(request):
        cs = request.query["cs"]
        html = PAGE.replace("<head>", f'<head><meta charset="{cs}">')
        return web.Response(body=html.encode(), headers={"Content-Type": "text/html"})

    async def results(request):
        base = f"http://{request.host}"
        hits = [{"title": "Bomb", "url": f"{base}/cs?cs=zlib&bomb=1", "content": "A zlib page."},
                {"title": "Bad", "url": f"{base}/cs?cs=punycode", "content": "A punycode page."},
                {"title": "Good", "url": f"{base}/cs?cs=utf-8", "content": "The good page."}]
        return web.json_response({"results": hits})

    app.router.add_get("/cs", declared)
    app.router.add_get("/meta", meta)
    app.router.add_get("/results/search", results)


@pytest.fixture
async def charset_site():
    site, runner = await start_site(_routes)
    yield site
    await runner.cleanup()


@pytest.mark.parametrize("charset", HOSTILE)
async def test_a_declared_codec_that_is_no_charset_is_ignored(charset_site, cfg, charset):
    tool = BrowserTool(cfg)
    try:
        for path in (f"/cs?cs={quote(charset)}", f"/meta?cs={quote(charset)}"):
            if "\x00" in charset and path.startswith("/cs"):
                continue  # aiohttp refuses a NUL in a header value
            r = await tool(charset_site.url(path))
            # ASCII bytes under a bogus name: read as UTF-8, the text intact
            assert r.ok, (path, r.error)
            assert "412 ships" in r.text, (path, r.text[:200])
    finally:
        await tool.aclose()


async def test_charset_zlib_inflates_nothing(charset_site, cfg):
    """A 200 kB body declared `charset=zlib` is not decompressed to 200 MB: bounded memory, no crash."""
    tool = BrowserTool(cfg)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        r = await tool(charset_site.url("/cs?cs=zlib&bomb=1"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        await tool.aclose()
    assert peak < 60_000_000, f"peak {peak / 1e6:.0f} MB while reading a {len(BOMB) / 1e3:.0f} kB page"
    assert "AAAAAAAAAAAAAAAAAAAA" not in (r.text or "")


@pytest.mark.parametrize("charset", ["zlib", "bz2", "base64", "punycode", "utf-7", "unicode_escape", "utf-32"])
def test_decode_body_never_uses_a_transform_codec(charset):
    text, codec = decode_body("Zürich \\u0041".encode(), charset)
    assert codec == "utf-8" and text == "Zürich \\u0041"


def test_utf16_without_bom_is_read_as_little_endian_like_a_browser():
    text, codec = decode_body("Zürich harbor".encode("utf-16-le"), "utf-16")
    assert codec == "utf-16-le" and text == "Zürich harbor"


async def test_one_hostile_page_does_not_fail_a_follow_search(charset_site, cfg):
    """The search's first hit is a zlib page, the second a punycode page: the third is still read."""
    search = SearxngSearchTool(endpoint=charset_site.url("/results"), k=3)
    tool = FollowSearchTool(search, BrowserTool(cfg), top_k=3, passage_chars=600)
    try:
        r = await tool("lighthouse winter")
    finally:
        await tool.aclose()
    assert r.ok, r.error
    assert r.metadata["followed"] == 3
    assert "412 ships" in r.text


class _FlakySummarizer:
    """Summarizes every page but raises on the second hit's (a bug on one page, not an outage)."""

    async def summarize(self, goal, title, url, passage):
        if "punycode" in url:
            raise ValueError("the summarizer choked on this page")
        return f"summary of {url}"


async def test_any_per_page_failure_keeps_that_page_s_snippet(charset_site, cfg):
    search = SearxngSearchTool(endpoint=charset_site.url("/results"), k=3)
    browser = BrowserTool(cfg)
    browser.summarizer = _FlakySummarizer()
    tool = FollowSearchTool(search, browser, top_k=3)
    try:
        r = await tool("lighthouse winter")
    finally:
        await tool.aclose()
    assert r.ok, r.error
    assert r.metadata["page_status"] == ["error", "error", "summarized"]  # the zlib page has no text
    assert "A punycode page." in r.text and "ValueError" in r.text
