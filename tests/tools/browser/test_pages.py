"""Every kind of page against a live local server: a useful result or a clear error, never a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time

import pytest

from agentenv.tools.browser import BrowserTool


async def browse(cfg, query: str):
    tool = BrowserTool(cfg)
    try:
        return await tool(query)
    finally:
        await tool.aclose()


async def test_article_keeps_main_content_and_drops_boilerplate(site, cfg):
    r = await browse(cfg, f"{site.url('/article')} | when was construction completed")
    assert r.ok, r.error
    assert r.text.startswith("Title: Eiffel Tower")
    assert f"URL: {site.url('/article')}" in r.text
    assert "Construction was completed on 31 March 1889" in r.text
    assert "Cookie settings" not in r.text and "Log in" not in r.text
    assert r.metadata["content_type"] == "text/html" and not r.metadata["truncated"]
    assert r.metadata["summarized"] is False and r.metadata["cache"] == "off"


async def test_50mb_page_is_cut_at_the_cap_and_the_download_stops(site, cfg):
    t0 = time.perf_counter()
    r = await browse(cfg, f"{site.url('/huge')} | river harbor")
    assert r.ok, r.error
    assert r.metadata["truncated"] is True
    assert r.metadata["num_bytes"] == cfg.max_bytes
    assert "Only the first 1,000,000 bytes" in r.text
    assert len(r.text) < cfg.passage_chars + 300
    await asyncio.wait_for(site.huge_done.wait(), 5)
    # The server noticed the hang-up long before 50 MB (socket buffers hold a few MB).
    assert site.huge_sent[0] < 20 * 2**20
    assert time.perf_counter() - t0 < 10


async def test_page_that_stalls_fails_on_the_read_timeout(site, cfg):
    t0 = time.perf_counter()
    r = await browse(cfg, site.url("/stall"))
    assert not r.ok and r.metadata["reason"] == "timeout"
    assert "stopped sending for 0.5 s" in r.error and "did not load" in r.error
    assert time.perf_counter() - t0 < 1.5


async def test_page_that_never_finishes_fails_on_the_total_timeout(site, cfg):
    cfg = dataclasses.replace(cfg, timeout_s=1.0)
    t0 = time.perf_counter()
    r = await browse(cfg, site.url("/trickle"))
    assert not r.ok and r.metadata["reason"] == "timeout"
    assert "did not finish loading within 1 s" in r.error
    assert 0.9 < time.perf_counter() - t0 < 2.0


async def test_redirect_loop_is_caught_at_the_first_repeat(site, cfg):
    r = await browse(cfg, site.url("/loop/a"))
    assert not r.ok and r.metadata["reason"] == "redirect_loop"
    assert "redirects in a loop" in r.error
    assert site.hits == {"/loop/a": 1, "/loop/b": 1}


async def test_redirects_are_followed_up_to_the_limit(site, cfg):
    r = await browse(cfg, site.url("/chain/3"))
    assert r.ok and r.metadata["final_url"] == site.url("/article")
    r = await browse(cfg, site.url("/chain/9"))
    assert not r.ok and r.metadata["reason"] == "too_many_redirects"
    assert f"more than {cfg.max_redirects} times" in r.error


@pytest.mark.parametrize("path,kind", [("/binary", "image/png"), ("/octet", "application/octet-stream")])
async def test_binary_file_is_a_readable_error(site, cfg, path, kind):
    r = await browse(cfg, site.url(path))
    assert not r.ok and r.metadata["reason"] == "unsupported_type"
    assert f"binary file ({kind}, 20.0 kB)" in r.error
    assert "HTML, plain text and PDF" in r.error


async def test_404_is_a_readable_error(site, cfg):
    r = await browse(cfg, site.url("/missing"))
    assert not r.ok and r.metadata["reason"] == "http_status"
    assert "HTTP 404 Not Found" in r.error


async def test_wrong_declared_charset_is_detected(site, cfg):
    r = await browse(cfg, site.url("/wrong-charset"))  # says utf-8, is cp1252
    assert r.ok, r.error
    assert "René Lefèvre" in r.text and "très réputé" in r.text
    assert r.metadata["encoding"] == "cp1252"
    r = await browse(cfg, site.url("/utf8-declared-latin1"))  # says iso-8859-1, is utf-8
    assert r.ok and "très réputé" in r.text and r.metadata["encoding"] == "utf-8"


async def test_relevant_passage_deep_in_the_page_is_selected(site, cfg):
    r = await browse(cfg, f"{site.url('/deep')} | What is the launch code of the Zephyr observatory?")
    assert r.ok, r.error
    assert site.needle in r.text
    assert r.metadata["passage_start"] > 100_000
    assert r.metadata["passage_chars"] <= cfg.passage_chars
    assert set(r.metadata["matched_terms"]) >= {"zephyr", "observatory", "launch", "code"}
    # Without a goal the start of the page is kept, and the needle is not in it.
    r = await browse(cfg, site.url("/deep"))
    assert r.ok and site.needle not in r.text and r.metadata["passage_start"] == 0


async def test_plain_text_page(site, cfg):
    r = await browse(cfg, site.url("/plain"))
    assert r.ok and site.needle in r.text and r.metadata["content_type"] == "text/plain"


async def test_pdf_page_with_the_extra(site, cfg):
    pytest.importorskip("pypdf")
    r = await browse(cfg, f"{site.url('/report.pdf')} | revenue growth")
    assert r.ok, r.error
    assert "revenue grew 42 percent in 2023" in r.text


async def test_pdf_page_without_the_extra_is_a_readable_error(site, cfg, monkeypatch):
    monkeypatch.setitem(sys.modules, "pypdf", None)  # import pypdf -> ImportError
    r = await browse(cfg, site.url("/report.pdf"))
    assert not r.ok and r.metadata["reason"] == "pdf_unavailable"
    assert "agentenv[pdf]" in r.error


async def test_all_pages_at_once_never_crash(site, cfg):
    cfg = dataclasses.replace(cfg, timeout_s=1.0)
    tool = BrowserTool(cfg)
    paths = ["/article", "/huge", "/stall", "/trickle", "/loop/a", "/chain/2", "/chain/8", "/binary", "/octet",
             "/missing", "/wrong-charset", "/deep", "/plain", "/nope", "/to-private"]
    results = await asyncio.gather(*(tool(site.url(p) + " | tower") for p in paths))
    await tool.aclose()
    for p, r in zip(paths, results):
        assert r.ok or (r.error and r.metadata["reason"]), p
    assert [r.ok for r in results] == [p in ("/article", "/huge", "/chain/2", "/wrong-charset", "/deep", "/plain") for p in paths]
