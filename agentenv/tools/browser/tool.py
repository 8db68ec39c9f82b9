"""`BrowserTool`: open a url, keep the passage that matters to a goal, summarize it.

Query format (the text between `<browse>` and `</browse>`):

- `URL | goal`, e.g. `https://en.wikipedia.org/wiki/Eiffel_Tower | year it was completed`
- `URL goal` (the first word is the url, the rest the goal)
- `URL` alone (the start of the page is kept)
- JSON `{"url": "...", "goal": "..."}`

A url without a scheme gets `https://`. Anything that keeps a page from being
read (bad url, refused address, timeout, 404, binary file) is an error result
the model reads; only a broken summarizer or cache raises `ToolError`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from agentenv.errors import ToolError
from agentenv.tools.browser.config import BrowserConfig
from agentenv.tools.browser.extract import extract_page
from agentenv.tools.browser.fetch import Fetcher, normalize_url
from agentenv.tools.browser.page import Page, PageError
from agentenv.tools.browser.select import select_passage
from agentenv.tools.browser.summarize import Generator, PolicySummarizer, Summarizer
from agentenv.types import ToolErrorKind, ToolResult

R = TypeVar("R")

QUERY_FORMAT = (
    'Write <browse>URL | goal</browse>, e.g. <browse>https://en.wikipedia.org/wiki/Eiffel_Tower | '
    'year the tower was completed</browse>, or the JSON {"url": "...", "goal": "..."}.'
)
MAX_QUERY_CHARS = 4000
_CACHE_FORMAT = 1  # bump when what is cached for a url changes
_INLINE_SELECT_CHARS = 50_000


_PAGE_ERROR_KINDS: dict[str, ToolErrorKind] = {
    "timeout": "timeout",
    "bad_query": "refused",
    "bad_url": "refused",
    "blocked": "refused",
    "unsupported_type": "agent",  # the page exists; the agent chose one the browser cannot read
    "empty": "agent",
    "too_large": "agent",
}


def page_error_kind(reason: str) -> ToolErrorKind:
    """The `ToolResult.kind` of a page that could not be read: what the agent asked for, or the network."""
    return _PAGE_ERROR_KINDS.get(reason, "http")


@dataclass(frozen=True)
class Digest:
    """One page read for a goal.

    Attributes:
        page: The page as text.
        body: The summary, or the selected passage when there is no summarizer.
        metadata: What `BrowserTool` reports in `ToolResult.metadata`.
    """

    page: Page
    body: str
    metadata: dict[str, Any]


def parse_query(query: str) -> tuple[str, str]:
    """Split a browse query into (url, goal); see the module docstring for the forms.

    Raises:
        PageError: The query is empty, too long or not one of the forms (reason `bad_query`).
    """
    q = query.strip()
    if not q:
        raise PageError("bad_query", f"Empty browse query. {QUERY_FORMAT}")
    if len(q) > MAX_QUERY_CHARS:
        raise PageError("bad_query", f"Browse query too long ({len(q)} characters, at most {MAX_QUERY_CHARS}).")
    if q.startswith("{"):
        try:
            obj = json.loads(q)
        except json.JSONDecodeError as e:  # what json.loads raises on bad text (a ValueError)
            raise PageError("bad_query", f"Browse query is not valid JSON ({e.msg}). {QUERY_FORMAT}") from None
        url, goal = obj.get("url"), obj.get("goal", "")  # text starting with "{" parses to a dict
        if not isinstance(url, str) or not url.strip():
            raise PageError("bad_query", f'Browse JSON needs a "url" string. {QUERY_FORMAT}')
        if not isinstance(goal, str):
            raise PageError("bad_query", f'Browse JSON "goal" must be a string. {QUERY_FORMAT}')
    elif "|" in q:
        url, _, goal = q.partition("|")
    else:
        url, _, goal = q.partition(" ")
    url = url.strip().strip("<>\"'`")
    if not url:
        raise PageError("bad_query", f"Browse query has no url. {QUERY_FORMAT}")
    return url, " ".join(goal.split())


class BrowserTool:
    """The `browse` tool.

    Stateless for the agent: `fork()` returns a handle on the same connection
    pool, cache and summarizer whose `aclose` does nothing; the prototype's
    `aclose` closes the pool.

    Args:
        config: Fetch, select and summarize settings.
        summarizer: A `Summarizer`, or any `Policy` (wrapped in a
            `PolicySummarizer` with the config's summary budgets). None returns
            the selected passage as is.
        cache: A `SearchCache` to keep extracted pages in; default: one at
            `config.cache` when set, else none.
    """

    name = "browse"
    description = "Open a web page and read the part of it that matters to a goal (summarized)."
    schema = {
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "The page's address."},
            "goal": {"type": "string", "description": "What to look for on the page."},
        },
        "required": ["url"],
    }

    def __init__(self, config: BrowserConfig | None = None, summarizer: Any = None, cache: Any = None):
        self.config = config or BrowserConfig()
        self.summarizer = as_summarizer(summarizer, self.config)
        if cache is None and self.config.cache:
            from agentenv.tools.search.cache import SearchCache

            cache = SearchCache(self.config.cache, ttl_s=self.config.cache_ttl_s)
        self.cache = cache
        self.fetcher = Fetcher(self.config)
        self._cache_params = {
            "format": _CACHE_FORMAT,
            "max_bytes": self.config.max_bytes,
            "full_extraction_max_bytes": self.config.full_extraction_max_bytes,
        }
        self._owner = True

    async def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        try:
            url, goal = parse_query(query)
        except PageError as e:
            return ToolResult(text="", ok=False, error=str(e), latency_s=time.perf_counter() - t0,
                              metadata={"reason": e.reason}, kind=page_error_kind(e.reason))
        return await self.browse(url, goal)

    async def browse(self, url: str, goal: str = "") -> ToolResult:
        """Read `url` and return the part relevant to `goal` (summarized when a summarizer is set)."""
        t0 = time.perf_counter()
        try:
            d = await self.digest(url, goal)
        except PageError as e:
            return ToolResult(
                text="", ok=False, error=str(e), latency_s=time.perf_counter() - t0,
                metadata={"url": url, "reason": e.reason}, kind=page_error_kind(e.reason),
            )
        return ToolResult(text=format_page(d.page, d.body), latency_s=time.perf_counter() - t0, metadata=d.metadata)

    async def digest(self, url: str, goal: str = "", passage_chars: int | None = None) -> Digest:
        """Fetch (or recall), select and summarize one page.

        Args:
            url: The page.
            goal: What the reader wants from it.
            passage_chars: Selection budget; default `config.passage_chars`.

        Raises:
            PageError: The page cannot be read.
            ToolError: The summarizer or the cache failed.
        """
        page, cache_hit = await self.read(url)
        budget = passage_chars or self.config.passage_chars
        text = page.text[: max(self.config.select_max_chars, budget)]  # selection's time and memory grow with it
        if len(text) > _INLINE_SELECT_CHARS:  # ~1 ms per 10k chars: keep the event loop free
            sel = await asyncio.to_thread(select_passage, text, goal, budget)
        else:
            sel = select_passage(text, goal, budget)
        passage = ("[...] " if sel.start > 0 else "") + sel.text + (" [...]" if sel.end < len(page.text) else "")
        body, summarized = passage, False
        if self.summarizer is not None:
            summary = await self.summarizer.summarize(goal, page.title, page.final_url, passage)
            # An empty summary (a weak model stopping at once) would hide the page: keep the passage.
            if summary:
                body, summarized = summary, True
        meta = {
            "url": page.url,
            "final_url": page.final_url,
            "title": page.title,
            "content_type": page.content_type,
            "encoding": page.encoding,
            "num_bytes": page.num_bytes,
            "truncated": page.truncated,
            "cache": "hit" if cache_hit else ("miss" if self.cache is not None else "off"),
            "page_chars": len(page.text),
            "passage_start": sel.start,
            "passage_chars": len(sel.text),
            "matched_terms": list(sel.matched),
            "summarized": summarized,
        }
        return Digest(page, body, meta)

    async def read(self, url: str) -> tuple[Page, bool]:
        """The page at `url` as text, from the cache when it holds it.

        Returns:
            (page, cache_hit)

        Raises:
            PageError: The page cannot be read.
        """
        key = normalize_url(url)
        if self.cache is not None:
            entry = await self._cache_call(self.cache.get, "browse", key, self._cache_params)
            if entry is not None:
                return Page(text=entry.text, **entry.metadata), True
        raw = await self.fetcher.fetch(key)
        page = await asyncio.to_thread(extract_page, raw, self.config.full_extraction_max_bytes)
        if self.cache is not None:
            meta = {k: v for k, v in asdict(page).items() if k != "text"}
            await self._cache_call(self.cache.put, "browse", key, self._cache_params, page.text, meta)
        return page, False

    @staticmethod
    async def _cache_call(fn: Callable[..., R], *args: object) -> R:
        try:
            return await asyncio.to_thread(fn, *args)
        except ToolError:
            raise
        except Exception as e:  # sqlite3 errors: the disk, not the page
            raise ToolError(f"browser page cache failed ({type(e).__name__}: {e}); check browse.cache_path is writable") from e

    def fork(self) -> BrowserTool:
        handle = copy.copy(self)  # shares the fetcher (pool), cache and summarizer
        handle._owner = False
        return handle

    async def aclose(self) -> None:
        if self._owner:
            await self.fetcher.aclose()


def format_page(page: Page, body: str) -> str:
    """What the model reads: title, final url, then the passage or summary."""
    note = f"\n(Only the first {page.num_bytes:,} bytes of this page were read.)" if page.truncated else ""
    return f"Title: {page.title or '(untitled)'}\nURL: {page.final_url}{note}\n\n{body}"


def as_summarizer(obj: Any, config: BrowserConfig) -> Summarizer | None:
    """None, a `Summarizer`, or a `Policy` wrapped with the config's budgets."""
    if obj is None or isinstance(obj, Summarizer):
        return obj
    if isinstance(obj, Generator):
        return PolicySummarizer(
            obj,
            max_tokens=config.summary_max_tokens,
            input_tokens=config.summary_input_tokens,
            temperature=config.summary_temperature,
        )
    raise TypeError(f"summarizer must be a Summarizer or a Policy, got {type(obj).__name__}")
