"""The local search tool: a retriever (BM25 or dense) behind the Tool protocol."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentenv.errors import ToolError
from agentenv.tools.search.corpus import Corpus
from agentenv.tools.search.format import (
    DEFAULT_K,
    DEFAULT_MAX_CHARS,
    SEARCH_DESCRIPTION,
    SEARCH_SCHEMA,
    Passage,
    format_pages,
    no_results_text,
    refuse_query,
)
from agentenv.types import ToolResult


class Retriever(Protocol):
    """Anything that ranks a corpus for a query (sync CPU work)."""

    def search(self, query: str, k: int) -> list[Passage]: ...


@runtime_checkable
class IndexedRetriever(Protocol):
    """A retriever over a corpus file (BM25, dense): the corpus and its scoring parameters decide its answers."""

    corpus: Corpus
    params: dict[str, Any]

    def search(self, query: str, k: int) -> list[Passage]: ...


def corpus_digest(retriever: Retriever) -> str | None:
    """The sha256 of the retriever's corpus file (None: a retriever over no file)."""
    return retriever.corpus.sha256 if isinstance(retriever, IndexedRetriever) else None


async def check_retriever(retriever: Retriever, query: str = "the") -> None:
    """A retriever's health check: it answers a query without raising (no hit is still an answer).

    Raises:
        ToolError: The retriever raised (an index that cannot load, a model that cannot run).
    """
    try:
        await asyncio.to_thread(retriever.search, query, 1)
    except Exception as e:  # noqa: BLE001 - any failure of the index is an infrastructure fault
        raise ToolError(f"the retriever ({type(retriever).__name__}) failed a query: {type(e).__name__}: {e}") from e


class LocalSearchTool:
    """Search a local corpus; results as `Page i: title\\ntext` blocks.

    Stateless: `fork()` returns self, so every episode shares one index.
    Retrieval runs in a worker thread so the event loop keeps serving other
    episodes while it scores.

    Args:
        retriever: Ranks the corpus (`BM25Retriever`, `DenseRetriever`).
        k: Results per query.
        max_chars: Each passage's text is cut to this many characters.
        provider: Name reported in metadata and used as the cache key's provider.
    """

    name = "search"
    description = SEARCH_DESCRIPTION
    schema = SEARCH_SCHEMA

    def __init__(self, retriever: Retriever, k: int = DEFAULT_K, max_chars: int = DEFAULT_MAX_CHARS, provider: str = "local"):
        self.retriever = retriever
        self.k = k
        self.max_chars = max_chars
        self.provider = provider

    @classmethod
    def from_corpus(
        cls, corpus_path: str | Path, k: int = DEFAULT_K, max_chars: int = DEFAULT_MAX_CHARS, **bm25_kwargs: Any
    ) -> LocalSearchTool:
        """BM25 over `corpus_path`, loading or building the index beside it (see `BM25Retriever.from_corpus`)."""
        from agentenv.tools.search.bm25 import BM25Retriever

        return cls(BM25Retriever.from_corpus(corpus_path, **bm25_kwargs), k=k, max_chars=max_chars)

    @property
    def cache_params(self) -> dict[str, Any]:
        """What, besides the query, decides this tool's answer (part of the cache key)."""
        params = self.retriever.params if isinstance(self.retriever, IndexedRetriever) else {}
        return {"k": self.k, "max_chars": self.max_chars, "corpus": corpus_digest(self.retriever), **params}

    async def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        q, refused = refuse_query(query)
        if refused is not None:
            return refused
        hits = await asyncio.to_thread(self.retriever.search, q, self.k)
        text = format_pages(hits, self.max_chars) if hits else no_results_text(q)
        return ToolResult(
            text=text,
            latency_s=time.perf_counter() - t0,
            metadata={"provider": self.provider, "num_results": len(hits), "ids": [h.id for h in hits]},
        )

    async def health_check(self) -> None:
        """The retriever answers a query (it loads its index here, not in the first episode)."""
        await check_retriever(self.retriever)

    def fork(self) -> LocalSearchTool:
        return self

    async def aclose(self) -> None:
        return None
