"""BM25 over a JSONL corpus (bm25s), with the index saved beside the corpus.

The index lives in `<corpus>.bm25/` (or `index_dir`): bm25s's arrays plus a
`manifest.json` holding the corpus's sha256 and the scoring parameters. It is
reused while both match and rebuilt when the corpus changed. Builds go to a
temporary folder that is renamed into place, under a file lock, so concurrent
processes never read a half-written index.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentenv.tools.search.corpus import Corpus, load_corpus
from agentenv.tools.search.format import Passage
from agentenv.tools.search.store import locked, publish, read_manifest

log = logging.getLogger(__name__)

_TOKEN_RE = re.compile(r"\w+", re.UNICODE)
# Kept small on purpose: bm25s's English list. Digits and one-letter tokens stay
# (years, ids and initials are what two-hop questions hinge on).
_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
_INDEX_FORMAT = 1


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens without English stopwords; the same for passages and queries."""
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


class BM25Retriever:
    """Sparse retrieval over one corpus. Sync and thread-safe for reads.

    Build with `BM25Retriever.from_corpus(path)`; `search` is CPU work, so async
    callers run it in a thread (see `LocalSearchTool`).
    """

    def __init__(self, corpus: Corpus, bm25: Any, build_s: float = 0.0, loaded: bool = False):
        self.corpus = corpus
        self._bm25 = bm25
        self._vocab: dict[str, int] = bm25.vocab_dict
        self.build_s = build_s
        """Seconds spent building the index (0.0 when loaded from disk)."""
        self.loaded = loaded
        """True when the index came from disk rather than a fresh build."""
        self.params = {"bm25_k1": bm25.k1, "bm25_b": bm25.b}
        """Scoring parameters (part of a cache key)."""

    @classmethod
    def from_corpus(
        cls,
        corpus_path: str | Path,
        index_dir: str | Path | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        save: bool = True,
    ) -> BM25Retriever:
        """Load the saved index for `corpus_path`, or build (and save) it.

        Args:
            corpus_path: JSONL corpus (`id`, `title`, `text`).
            index_dir: Where the index lives; default `<corpus_path>.bm25`.
            k1: BM25 term-frequency saturation.
            b: BM25 length normalization.
            save: Write a fresh build to `index_dir` (a read-only folder only logs a warning).

        Raises:
            ToolError: The corpus is missing or malformed.
        """
        corpus = load_corpus(corpus_path)
        index_dir = Path(index_dir) if index_dir is not None else corpus.path.with_name(corpus.path.name + ".bm25")
        params = {"format": _INDEX_FORMAT, "sha256": corpus.sha256, "num_docs": len(corpus), "k1": k1, "b": b}
        with locked(index_dir, enabled=save):
            bm25 = _try_load(index_dir, params)
            if bm25 is not None:
                return cls(corpus, bm25, loaded=True)
            t0 = time.perf_counter()
            bm25 = _build(corpus, k1, b)
            build_s = time.perf_counter() - t0
            if save:
                publish(index_dir, lambda d: bm25.save(str(d), show_progress=False), params)
        return cls(corpus, bm25, build_s=build_s)

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, query: str, k: int) -> list[Passage]:
        """The top `k` passages for `query` with a positive score, best first (ties: corpus order)."""
        ids = [self._vocab[t] for t in tokenize(query) if t in self._vocab]
        if not ids or k < 1:
            return []
        scores = self._bm25.get_scores_from_ids(np.asarray(ids, dtype=np.int32))  # (num_docs,)
        k = min(k, scores.shape[0])
        top = np.argpartition(-scores, k - 1)[:k]
        # Sort by score descending, then by index so equal scores rank stably.
        top = top[np.lexsort((top, -scores[top]))]
        out = []
        for i in top:
            s = float(scores[i])
            if s <= 0.0:
                break
            p = self.corpus.passages[i]
            out.append(Passage(title=p.title, text=p.text, url=p.url, id=p.id, score=s))
        return out


def _build(corpus: Corpus, k1: float, b: float) -> Any:
    import bm25s

    tokens = [tokenize(f"{p.title} {p.text}") for p in corpus.passages]
    bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
    bm25.index(tokens, show_progress=False)
    return bm25


def _try_load(index_dir: Path, params: dict[str, Any]) -> Any:
    saved = read_manifest(index_dir)
    if saved is None:
        return None
    if saved != params:
        log.info("BM25 index %s is stale (corpus or parameters changed); rebuilding", index_dir)
        return None
    import bm25s

    try:
        return bm25s.BM25.load(str(index_dir), show_progress=False, verbosity=0)
    except Exception as e:  # a damaged index is rebuilt, not fatal
        log.warning("BM25 index %s unreadable (%s); rebuilding", index_dir, e)
        return None
