"""Search tools: a local retriever (BM25, dense) and web providers, all answering as `Page i: title\\ntext`."""

from agentenv.tools.search.bm25 import BM25Retriever
from agentenv.tools.search.corpus import Corpus, load_corpus
from agentenv.tools.search.format import DEFAULT_K, DEFAULT_MAX_CHARS, Passage, format_pages
from agentenv.tools.search.local import LocalSearchTool, Retriever

__all__ = [
    "BM25Retriever",
    "Corpus",
    "DEFAULT_K",
    "DEFAULT_MAX_CHARS",
    "LocalSearchTool",
    "Passage",
    "Retriever",
    "format_pages",
    "load_corpus",
]
