"""`replay`: recorded web search results replayed, and BM25 over every recorded snippet for other queries.

A recording is a JSON object of query -> results text in the `Page i: snippet`
lines Bing's snippets were saved as (ARPO's `search_cache.json`: 1,000 queries
its models wrote during training, about 8,400 real snippets). A query the
recording holds (compared without case, extra spaces or a `search query: `
prefix) gets its recorded results; any other query gets the best-matching
recorded snippets by BM25, in the same format. So a run searches real web text
offline, on the topics the recording covers.

The snippets' corpus and its BM25 index are written once under
`$AGENTENV_CACHE/search/replay-<sha256 of the recording>/`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from agentenv.cache import build_once, cache_root
from agentenv.errors import ToolError
from agentenv.tools.search.format import (
    DEFAULT_K,
    DEFAULT_MAX_CHARS,
    SEARCH_DESCRIPTION,
    SEARCH_SCHEMA,
    no_results_text,
    refuse_query,
)
from agentenv.tools.search.local import Retriever, check_retriever, corpus_digest
from agentenv.types import ToolResult

_PAGE_RE = re.compile(r"^Page \d+: ", re.MULTILINE)
_PREFIX = "search query:"


def normalize_query(query: str) -> str:
    """The form recorded queries are matched in: no `search query:` prefix, lowercase, single spaces."""
    q = " ".join(query.split()).lower()
    if q.startswith(_PREFIX):
        q = q[len(_PREFIX) :].strip()
    return q


def split_snippets(text: str) -> list[str]:
    """The snippets of a `Page 1: ...\\nPage 2: ...` results text, in order."""
    return [s.strip() for s in _PAGE_RE.split(text) if s.strip()]


def format_snippets(snippets: list[str], k: int, max_chars: int) -> str:
    """`Page i: snippet` lines, the first `k`, each cut to `max_chars` characters."""
    return "\n".join(f"Page {i}: {s[:max_chars]}" for i, s in enumerate(snippets[:k], start=1))


def load_recording(path: str | Path) -> dict[str, str]:
    """The recording's query -> results text.

    Raises:
        ToolError: Missing, unreadable, or not a JSON object of strings.
    """
    p = Path(path).expanduser()
    try:
        raw = json.loads(p.read_text())
    except OSError as e:
        raise ToolError(f"search recording not found or unreadable: {str(p)!r} ({e}); point `corpus` at it") from e
    except ValueError as e:
        raise ToolError(f"search recording {str(p)!r} is not valid JSON: {e}") from e
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ToolError(f"search recording {str(p)!r} must be a JSON object of query -> results text")
    if not raw:
        raise ToolError(f"search recording {str(p)!r} holds no queries")
    return raw


def _write_corpus(recording: dict[str, str], folder: Path) -> None:
    seen: set[str] = set()
    with open(folder / "corpus.jsonl", "w") as f:
        for qi, text in enumerate(recording.values()):
            for pi, snippet in enumerate(split_snippets(text), start=1):
                if snippet in seen:
                    continue
                seen.add(snippet)
                f.write(json.dumps({"id": f"q{qi}-p{pi}", "title": "", "text": snippet}, ensure_ascii=False) + "\n")


class ReplaySearchTool:
    """Search over a recording of real results (see the module docstring). Stateless: `fork()` returns self.

    Args:
        recording: Query -> results text.
        retriever: BM25 over the recording's snippets.
        k: Results per query.
        max_chars: Each snippet is cut to this many characters.
    """

    name = "search"
    description = SEARCH_DESCRIPTION
    schema = SEARCH_SCHEMA
    provider = "replay"

    def __init__(self, recording: dict[str, str], retriever: Retriever, k: int = DEFAULT_K, max_chars: int = DEFAULT_MAX_CHARS):
        self._recorded = {normalize_query(q): split_snippets(t) for q, t in recording.items()}
        self.retriever = retriever
        self.k = k
        self.max_chars = max_chars
        self.replayed = 0
        self.retrieved = 0

    @classmethod
    def from_file(
        cls, path: str | Path, k: int = DEFAULT_K, max_chars: int = DEFAULT_MAX_CHARS, index_dir: str | Path | None = None,
        **bm25_kwargs: Any,
    ) -> ReplaySearchTool:  # fmt: skip
        """Read a recording and load (or build once) the BM25 index of its snippets."""
        from agentenv.tools.search.bm25 import BM25Retriever

        recording = load_recording(path)
        digest = hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()[:16]
        folder = build_once(cache_root() / "search" / f"replay-{digest}", lambda tmp: _write_corpus(recording, tmp))
        index = Path(index_dir) if index_dir is not None else folder / "bm25"
        return cls(recording, BM25Retriever.from_corpus(folder / "corpus.jsonl", index_dir=index, **bm25_kwargs), k, max_chars)

    @property
    def cache_params(self) -> dict[str, Any]:
        """What, besides the query, decides the answer (part of a cache key)."""
        return {"k": self.k, "max_chars": self.max_chars, "corpus": corpus_digest(self.retriever)}

    async def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        q, refused = refuse_query(query, empty_hint="write keywords to search for.")
        if refused is not None:
            return refused
        recorded = self._recorded.get(normalize_query(q))
        if recorded:
            self.replayed += 1
            snippets, how = recorded, "replayed"
        else:
            self.retrieved += 1
            snippets, how = [p.text for p in await asyncio.to_thread(self.retriever.search, q, self.k)], "retrieved"
        text = format_snippets(snippets, self.k, self.max_chars) if snippets else no_results_text(q)
        return ToolResult(
            text=text,
            latency_s=time.perf_counter() - t0,
            metadata={"provider": "replay", "source": how, "num_results": min(len(snippets), self.k)},
        )

    async def health_check(self) -> None:
        """The retriever answers a query (it loads its index here, not in the first episode)."""
        await check_retriever(self.retriever)

    def fork(self) -> ReplaySearchTool:
        return self

    async def aclose(self) -> None:
        return None
