"""BM25 over a JSONL corpus (bm25s), with the index saved beside the corpus.

The index lives in `<corpus>.bm25/` (or `index_dir`): bm25s's arrays plus a
`manifest.json` holding the corpus's sha256 and the scoring parameters. It is
reused while both match and rebuilt when the corpus changed. Builds go to a
temporary folder that is renamed into place, under a file lock, so concurrent
processes never read a half-written index.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from agentenv.tools.search.corpus import Corpus, load_corpus
from agentenv.tools.search.format import Passage

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

    def __init__(self, corpus: Corpus, bm25, build_s: float = 0.0, loaded: bool = False):
        self.corpus = corpus
        self._bm25 = bm25
        self._vocab: dict[str, int] = bm25.vocab_dict
        self.build_s = build_s
        """Seconds spent building the index (0.0 when loaded from disk)."""
        self.loaded = loaded
        """True when the index came from disk rather than a fresh build."""

    @classmethod
    def from_corpus(
        cls,
        corpus_path: str | Path,
        index_dir: str | Path | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        save: bool = True,
    ) -> "BM25Retriever":
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
        with _locked(index_dir, enabled=save):
            bm25 = _try_load(index_dir, params)
            if bm25 is not None:
                return cls(corpus, bm25, loaded=True)
            t0 = time.perf_counter()
            bm25 = _build(corpus, k1, b)
            build_s = time.perf_counter() - t0
            if save:
                _save(bm25, index_dir, params)
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


def _build(corpus: Corpus, k1: float, b: float):
    import bm25s

    tokens = [tokenize(f"{p.title} {p.text}") for p in corpus.passages]
    bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
    bm25.index(tokens, show_progress=False)
    return bm25


def _try_load(index_dir: Path, params: dict):
    manifest = index_dir / "manifest.json"
    try:
        saved = json.loads(manifest.read_text())
    except (OSError, ValueError):
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


def _save(bm25, index_dir: Path, params: dict) -> None:
    tmp: Path | None = None
    try:
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=index_dir.name + ".tmp-", dir=index_dir.parent))
        bm25.save(str(tmp), show_progress=False)
        # The manifest is written last: a folder without it is never trusted.
        (tmp / "manifest.json").write_text(json.dumps(params))
        if index_dir.exists():
            old = index_dir.with_name(f"{index_dir.name}.old-{os.getpid()}")
            os.replace(index_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, index_dir)
    except OSError as e:
        log.warning("could not save BM25 index to %s (%s); it stays in memory only", index_dir, e)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _locked(index_dir: Path, enabled: bool):
    """Exclusive lock on `<index_dir>.lock`: one process builds, the others wait and load."""
    if not enabled:
        yield
        return
    lock_path = index_dir.with_name(index_dir.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield  # read-only folder: nothing to build into anyway
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
