"""Search tools: a local retriever (BM25, dense) and web providers (Bing v7, SearXNG).

Every provider answers as `Page i: title\\ntext` blocks. Build one from a config
with `make_search_tool(SearchToolConfig(...))`; web providers, dense retrieval
and the cache load their dependencies only when asked for.
"""

from typing import Any

from agentenv.tools.search.bm25 import BM25Retriever
from agentenv.tools.search.cache import CachedSearchTool, SearchCache
from agentenv.tools.search.config import SearchToolConfig, make_search_tool
from agentenv.tools.search.corpus import Corpus, load_corpus
from agentenv.tools.search.format import DEFAULT_K, DEFAULT_MAX_CHARS, Passage, format_pages
from agentenv.tools.search.local import LocalSearchTool, Retriever
from agentenv.tools.search.ratelimit import TokenBucket

__all__ = [
    "BM25Retriever",
    "CachedSearchTool",
    "Corpus",
    "DEFAULT_K",
    "DEFAULT_MAX_CHARS",
    "LocalSearchTool",
    "Passage",
    "Retriever",
    "SearchCache",
    "SearchToolConfig",
    "TokenBucket",
    "format_pages",
    "load_corpus",
    "make_search_tool",
]


def __getattr__(name: str) -> Any:
    # Web clients pull in aiohttp, dense pulls in faiss and torch: import on first use.
    lazy = {
        "BingSearchTool": "agentenv.tools.search.bing",
        "SearxngSearchTool": "agentenv.tools.search.searxng",
        "HTTPSearchTool": "agentenv.tools.search.http",
        "RetryPolicy": "agentenv.tools.search.http",
        "DenseRetriever": "agentenv.tools.search.dense",
    }
    if name in lazy:
        import importlib

        return getattr(importlib.import_module(lazy[name]), name)
    raise AttributeError(f"module 'agentenv.tools.search' has no attribute {name!r}")
