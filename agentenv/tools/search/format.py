"""Passages and the `Page i: title\\ntext` format every search provider returns."""

from __future__ import annotations

from dataclasses import dataclass

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
