"""Passages and the `Page i: title\\ntext` format every search provider returns."""

from __future__ import annotations

from dataclasses import dataclass

from agentenv.types import ToolResult

DEFAULT_K = 10
"""Results per query (ARPO, arXiv 2507.19849: Bing's top-10 snippets)."""

DEFAULT_MAX_CHARS = 1000
"""Each passage's text is cut to this many characters (ARPO's setting)."""

SEARCH_DESCRIPTION = "Search the web. Returns the top results, each as 'Page i: title' and a snippet."
SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "Keywords to search for."}},
    "required": ["query"],
}
"""What every search provider declares to chat formats (`agentenv.tools.base.tool_schema`)."""

MAX_QUERY_CHARS = 2000
"""Longer queries are answered with an error result (they are the model rambling, not a search)."""

TAGS_HINT = "write keywords between the search tags."
"""What an empty query's refusal tells the model to do (the providers read by a tags format)."""


def refuse_query(query: str, empty_hint: str = TAGS_HINT) -> tuple[str, ToolResult | None]:
    """Every search provider's check of a query: the stripped query, and a refused result when it is
    empty or longer than `MAX_QUERY_CHARS` (None when it may be searched).

    Args:
        query: The model's query as written.
        empty_hint: The sentence after "Empty search query:" (what to write instead).
    """
    q = query.strip()
    if not q:
        return q, ToolResult(text="", ok=False, error=f"Empty search query: {empty_hint}", kind="refused")
    if len(q) > MAX_QUERY_CHARS:
        return q, ToolResult(
            text="", ok=False, error=f"Search query too long ({len(q)} characters, at most {MAX_QUERY_CHARS}).",
            kind="refused",
        )
    return q, None


DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""Most bytes of a web provider's answer; a real one is tens of kB (Bing's 50 results: ~100 kB)."""


@dataclass(frozen=True)
class Passage:
    """One search hit.

    Attributes:
        title: Page or passage title (Bing's `name`, SearXNG's `title`).
        text: Passage text or web snippet.
        url: Source address, "" for a local corpus.
        id: Corpus id or url; what the metadata reports.
        score: Retriever score (BM25, cosine); 0.0 for web providers.
    """

    title: str
    text: str
    url: str = ""
    id: str = ""
    score: float = 0.0


def format_pages(passages: list[Passage], max_chars: int = DEFAULT_MAX_CHARS, show_url: bool = False) -> str:
    """Render hits as `Page i: title\\ntext` blocks (1-based) joined by blank lines.

    Args:
        passages: Hits, best first.
        max_chars: Each passage's title, url and text are cut to this many
            characters (a provider's answer can hold a title of any length).
        show_url: Put the url on its own line under the title (for agents that browse).
    """
    blocks = []
    for i, p in enumerate(passages, start=1):
        head = f"Page {i}: {p.title[:max_chars]}"
        if show_url and p.url:
            head += f"\n{p.url[:max_chars]}"
        blocks.append(f"{head}\n{p.text[:max_chars]}")
    return "\n\n".join(blocks)


def no_results_text(query: str) -> str:
    """What the model reads when a query matches nothing."""
    return f"No results found for '{query}'. Try different keywords."
