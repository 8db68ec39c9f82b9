"""The browser tool: fetch a page, keep the passage that matters, let a model summarize it.

- `BrowserTool` (`<browse>URL | goal</browse>`): one page for one goal.
- `FollowSearchTool`: wraps a search tool so its top results are opened and
  summarized instead of shown as snippets.

Fetching is guarded: only http(s), and only public addresses unless
`BrowserConfig.allow_hosts` says otherwise.

Only the config loads with the package (config validation must not import
aiohttp); everything else loads on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentenv.tools.browser.config import DEFAULT_PASSAGE_CHARS, BrowserConfig

if TYPE_CHECKING:  # pragma: no cover
    from agentenv.tools.browser.tool import BrowserTool

_LAZY = {
    "AddressPolicy": "agentenv.tools.browser.guard",
    "address_kind": "agentenv.tools.browser.guard",
    "BrowserTool": "agentenv.tools.browser.tool",
    "Digest": "agentenv.tools.browser.tool",
    "QUERY_FORMAT": "agentenv.tools.browser.tool",
    "parse_query": "agentenv.tools.browser.tool",
    "EndpointSummarizer": "agentenv.tools.browser.summarize",
    "PolicySummarizer": "agentenv.tools.browser.summarize",
    "Summarizer": "agentenv.tools.browser.summarize",
    "Fetcher": "agentenv.tools.browser.fetch",
    "normalize_url": "agentenv.tools.browser.fetch",
    "FollowSearchTool": "agentenv.tools.browser.follow",
    "split_pages": "agentenv.tools.browser.follow",
    "Page": "agentenv.tools.browser.page",
    "PageError": "agentenv.tools.browser.page",
    "RawPage": "agentenv.tools.browser.page",
    "Selection": "agentenv.tools.browser.select",
    "select_passage": "agentenv.tools.browser.select",
}


def make_browser_tool(config: BrowserConfig | dict[str, Any] | None = None, summarizer: Any = None, **options: Any) -> BrowserTool:
    """A `BrowserTool` from a config, a dict of its fields, or keyword fields (the `Browser-v0` factory).

    Args:
        config: The validated config, or a mapping of its fields.
        summarizer: A `Summarizer` or a `Policy`; None returns selected passages as they are.
        **options: Fields of `BrowserConfig` (merged over a mapping `config`).
    """
    from agentenv.tools.browser.tool import BrowserTool

    if isinstance(config, BrowserConfig):
        if options:
            raise TypeError("pass either a BrowserConfig or keyword options, not both")
        return BrowserTool(config, summarizer=summarizer)
    from agentenv.loader import build_dataclass

    return BrowserTool(build_dataclass(BrowserConfig, {**(config or {}), **options}, "browse"), summarizer=summarizer)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentenv.tools.browser' has no attribute {name!r}")


__all__ = ["DEFAULT_PASSAGE_CHARS", "BrowserConfig", "make_browser_tool", *sorted(_LAZY)]
