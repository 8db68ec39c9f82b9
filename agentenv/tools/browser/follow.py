"""A search tool that opens its top results and answers with what they say.

ARPO's deep-search setting (arXiv 2507.19849) lets a browser agent read the
pages search returns and condense them; here that is a wrapper around any
search tool whose results carry their urls in `metadata["urls"]` (the web
providers do). The answer keeps the search format, `Page i: title` blocks, with
the top pages' summaries (or selected passages) in place of their snippets.
"""

from __future__ import annotations

import asyncio
import re
import time

from agentenv.errors import ToolError
from agentenv.tools.base import Tool, description_of, schema_of
from agentenv.tools.browser.page import PageError
from agentenv.tools.browser.tool import BrowserTool
from agentenv.types import ToolResult

_PAGE_HEAD = re.compile(r"^Page (\d+): ?(.*)$", re.MULTILINE)


def split_pages(text: str) -> list[tuple[str, str]]:
    """`Page i: title\\ntext` blocks -> [(title, text)], in order ([] when the text has none)."""
    heads = list(_PAGE_HEAD.finditer(text))
    out = []
    for k, m in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(text)
        out.append((m.group(2).strip(), text[m.end() : end].strip("\n")))
    return out


class FollowSearchTool:
    """Search, then browse the top results with the search query as the goal.

    A page that cannot be opened, for whatever reason of its own, keeps its
    snippet (with the reason); only an infrastructure fault (`ToolError`: the
    summarizer or the cache) fails the call. Results below `top_k` keep their
    snippets. When the search result has no urls (a local corpus), it is
    returned unchanged with `metadata["followed"] = 0`.

    Args:
        search: Any search tool (its `name` is kept, so the agent still writes `<search>`).
        browser: Reads the pages (its summarizer, cache and address policy apply).
        top_k: Results to open.
        passage_chars: Selection budget per page when the browser has no
            summarizer (several 6,000-character passages would flood the context).
    """

    def __init__(self, search: Tool, browser: BrowserTool, top_k: int = 3, passage_chars: int = 2000):
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.search = search
        self.browser = browser
        self.top_k = top_k
        self.passage_chars = passage_chars
        self.name = search.name
        self.description = description_of(search)
        self.schema = schema_of(search)

    async def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        res = await self.search(query)
        urls = [u for u in (res.metadata.get("urls") or []) if u][: self.top_k] if res.ok else []
        if not urls:
            res.metadata["followed"] = 0
            return res
        goal = " ".join(query.split())
        chars = None if self.browser.summarizer is not None else self.passage_chars
        outcomes = await asyncio.gather(*(self._open(u, goal, chars) for u in urls))
        pages = split_pages(res.text)
        blocks, status = [], []
        for i, (url, (body, ok, summ)) in enumerate(zip(urls, outcomes)):
            status.append("summarized" if summ else "passage" if ok else "error")
            title, snippet = pages[i] if i < len(pages) else ("", "")
            snippet = snippet.removeprefix(url).lstrip("\n")  # `show_url` put it there already
            if not ok:
                body = f"{snippet}\n(Could not open the page: {body})" if snippet else f"(Could not open the page: {body})"
            blocks.append(f"Page {i + 1}: {title}\n{url}\n{body}")
        for i in range(len(urls), len(pages)):
            title, snippet = pages[i]
            blocks.append(f"Page {i + 1}: {title}\n{snippet}")
        meta = {
            **res.metadata,
            "followed": len(urls),
            "opened": sum(s != "error" for s in status),
            "page_status": status,  # per followed url: summarized, passage (no or empty summary), error
        }
        return ToolResult(text="\n\n".join(blocks), latency_s=time.perf_counter() - t0, metadata=meta)

    async def _open(self, url: str, goal: str, chars: int | None) -> tuple[str, bool, bool]:
        """(summary or passage, opened, summarized), or (reason, False, False)."""
        try:
            d = await self.browser.digest(url, goal, passage_chars=chars)
        except PageError as e:
            return str(e), False, False
        except ToolError:
            raise  # the summarizer or the cache is down: no page can be read, so the call fails
        except Exception as e:  # noqa: BLE001 - one hostile page must not fail the whole search
            return f"the page could not be read ({type(e).__name__}: {e})", False, False
        return d.body, True, d.metadata["summarized"]

    def fork(self) -> FollowSearchTool:
        return FollowSearchTool(self.search.fork(), self.browser.fork(), self.top_k, self.passage_chars)

    async def aclose(self) -> None:
        # Prototypes close their pools; forks' aclose is a no-op on shared pools.
        await self.search.aclose()
        await self.browser.aclose()
