"""The browser tool: fetch a page, keep the passage that matters, let a model summarize it.

- `BrowserTool` (`<browse>URL | goal</browse>`): one page for one goal.
- `FollowSearchTool`: wraps a search tool so its top results are opened and
  summarized instead of shown as snippets.

Fetching is guarded: only http(s), and only public addresses unless
`BrowserConfig.allow_hosts` says otherwise.
"""

from __future__ import annotations

from typing import Any

from agentenv.tools.browser.config import DEFAULT_PASSAGE_CHARS, BrowserConfig
from agentenv.tools.browser.fetch import Fetcher, normalize_url
from agentenv.tools.browser.follow import FollowSearchTool, split_pages
from agentenv.tools.browser.guard import AddressPolicy, address_kind
from agentenv.tools.browser.page import Page, PageError, RawPage
from agentenv.tools.browser.select import Selection, select_passage
from agentenv.tools.browser.summarize import EndpointSummarizer, PolicySummarizer, Summarizer
from agentenv.tools.browser.tool import QUERY_FORMAT, BrowserTool, Digest, parse_query


def make_browser_tool(config: BrowserConfig | dict[str, Any] | None = None, summarizer: Any = None, **options: Any) -> BrowserTool:
    """A `BrowserTool` from a config, a dict of its fields, or keyword fields (the `Browser-v0` factory)."""
    if isinstance(config, BrowserConfig):
        if options:
            raise TypeError("pass either a BrowserConfig or keyword options, not both")
        return BrowserTool(config, summarizer=summarizer)
    return BrowserTool(BrowserConfig.from_options({**(config or {}), **options}), summarizer=summarizer)


__all__ = [
    "DEFAULT_PASSAGE_CHARS",
    "QUERY_FORMAT",
    "AddressPolicy",
    "BrowserConfig",
    "BrowserTool",
    "Digest",
    "EndpointSummarizer",
    "Fetcher",
    "FollowSearchTool",
    "Page",
    "PageError",
    "PolicySummarizer",
    "RawPage",
    "Selection",
    "Summarizer",
    "address_kind",
    "make_browser_tool",
    "normalize_url",
    "parse_query",
    "select_passage",
    "split_pages",
]
