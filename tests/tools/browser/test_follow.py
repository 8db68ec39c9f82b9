"""Search, then open the top results: summaries (or passages) replace snippets."""

from __future__ import annotations

import pytest

from agentenv.tools.browser import BrowserTool, FollowSearchTool, split_pages
from agentenv.tools.search import LocalSearchTool
from agentenv.tools.search.searxng import SearxngSearchTool


def test_split_pages():
    text = "Page 1: A\nfirst\nmore\n\nPage 2: B\nsecond"
    assert split_pages(text) == [("A", "first\nmore"), ("B", "second")]
    assert split_pages("No results found") == []


async def test_follow_opens_the_top_results_and_keeps_the_rest(site, cfg):
    search = SearxngSearchTool(endpoint=site.base, k=4)
    tool = FollowSearchTool(search, BrowserTool(cfg), top_k=3, passage_chars=800)
    assert tool.name == "search"
    r = await tool("launch code of the Zephyr observatory")
    assert r.ok, r.error
    pages = split_pages(r.text)
    assert [t for t, _ in pages] == ["Zephyr observatory archive", "Gone page", "Eiffel Tower", "Notes"]
    # Page 1 was opened: the passage holding the answer replaces the snippet.
    assert site.needle in pages[0][1] and "An archive of filler." not in pages[0][1]
    assert pages[0][1].startswith(site.url("/deep"))
    # Page 2 could not be opened: its snippet stays, with the reason.
    assert "Snippet of a page that is gone." in pages[1][1] and "HTTP 404" in pages[1][1]
    # Page 4 is below top_k: snippet only, never fetched.
    assert pages[3][1] == "Plain notes snippet." and "/plain" not in site.hits
    assert r.metadata["followed"] == 3 and r.metadata["opened"] == 2
    assert r.metadata["page_status"] == ["passage", "error", "passage"]
    assert len(pages[0][1]) < 800 + 200
    fork = tool.fork()
    assert fork.name == "search" and fork.browser.fetcher is tool.browser.fetcher
    await fork.aclose()
    await tool.aclose()


async def test_results_without_urls_pass_through(tmp_path, cfg):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "title": "Zephyr", "text": "The Zephyr observatory."}\n')
    local = LocalSearchTool.from_corpus(corpus)
    tool = FollowSearchTool(local, BrowserTool(cfg))
    r = await tool("zephyr observatory")
    assert r.ok and r.text.startswith("Page 1: Zephyr") and r.metadata["followed"] == 0


async def test_failed_search_passes_through(cfg):
    tool = FollowSearchTool(SearxngSearchTool(endpoint="http://127.0.0.1:9"), BrowserTool(cfg))
    r = await tool("   ")
    assert not r.ok and "Empty search query" in r.error


def test_top_k_must_be_positive(cfg):
    with pytest.raises(ValueError, match="top_k"):
        FollowSearchTool(SearxngSearchTool(endpoint="http://127.0.0.1:9"), BrowserTool(cfg), top_k=0)


@pytest.fixture
def tiny_path(request):
    """The tiny model's folder (a sync fixture: building it runs its own event loop)."""
    return request.getfixturevalue("tiny_model_path")


async def test_search_then_browse_with_the_tiny_model_as_summarizer(tiny_path, site, cfg):
    """End to end: SearXNG-style search -> open the top pages -> the tiny model summarizes each."""
    import dataclasses

    from agentenv.policies.hf import HFPolicy

    policy = HFPolicy.from_pretrained(str(tiny_path), device="cpu")
    cfg = dataclasses.replace(cfg, summary_max_tokens=16, summary_input_tokens=200)
    browser = BrowserTool(cfg, summarizer=policy)
    tool = FollowSearchTool(SearxngSearchTool(endpoint=site.base, k=4), browser, top_k=3)
    r = await tool("Zephyr observatory launch code")
    await tool.aclose()
    assert r.ok, r.error
    assert r.metadata["followed"] == 3 and r.metadata["opened"] == 2
    pages = split_pages(r.text)
    assert [t for t, _ in pages] == ["Zephyr observatory archive", "Gone page", "Eiffel Tower", "Notes"]
    assert "HTTP 404" in pages[1][1] and pages[3][1] == "Plain notes snippet."
    status = r.metadata["page_status"]
    assert status[1] == "error" and status[0] != "error" and status[2] != "error"
    # The model ran on both opened pages (greedy, so the outcome is fixed for a given model); where
    # it wrote something, that text replaced the snippet and is bounded by summary_max_tokens.
    assert policy.stats.requests == 2
    tok = policy.tokenizer
    for i in (0, 2):
        url, _, body = pages[i][1].partition("\n")
        assert url.startswith(site.base) and body
        if status[i] == "summarized":
            assert len(tok.encode(body, add_special_tokens=False)) <= 16 + 2
        else:  # an empty summary falls back to the selected passage
            assert "[...]" in body or "Eiffel" in body or "Zephyr" in body
