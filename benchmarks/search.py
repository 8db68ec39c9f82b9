"""Local search latency: BM25 over a synthetic corpus, the async tool, and the cache, side by side.

Usage: python benchmarks/search.py [--passages 100000] [--queries 500] [--concurrency 16] [--workdir DIR]

Prints a markdown table: index build and reload time, BM25 latency (p50/p95)
and queries per second called directly, through `LocalSearchTool` (one at a
time and concurrently), a cache miss (BM25 + SQLite write) and a cache hit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from agentenv.tools.search import BM25Retriever, CachedSearchTool, LocalSearchTool, SearchCache


def make_corpus(path: Path, n: int, seed: int = 0, vocab: int = 50_000) -> list[str]:
    """Write `n` passages of Zipf-distributed made-up words; return their titles (query seeds)."""
    rng = np.random.default_rng(seed)
    syll = ["ka", "lo", "mi", "ru", "te", "sa", "ne", "vo", "zi", "pa", "do", "fe", "gu", "hi", "ja", "ko"]
    words = ["".join(rng.choice(syll, size=rng.integers(2, 5))) + str(i % 7) for i in range(vocab)]
    ranks = np.arange(1, vocab + 1)
    p = 1.0 / ranks**1.05
    p /= p.sum()
    lengths = rng.integers(40, 120, size=n)  # words per passage: about 500 characters
    drawn = rng.choice(vocab, size=int(lengths.sum()), p=p)  # one draw for all passages
    ends = np.cumsum(lengths)
    title_ids = rng.integers(200, vocab, size=(n, 2))  # titles avoid the most common words
    titles = []
    with path.open("w") as f:
        for i in range(n):
            text = " ".join(words[j] for j in drawn[ends[i] - lengths[i] : ends[i]])
            title = " ".join(words[j] for j in title_ids[i])
            titles.append(title)
            f.write(json.dumps({"id": str(i), "title": title, "text": text}) + "\n")
    return titles


def make_queries(corpus_path: Path, n: int, seed: int = 1) -> list[str]:
    """Queries of 3-6 words taken from random passages (title words plus text words), so they match."""
    rng = np.random.default_rng(seed)
    lines = corpus_path.read_text().splitlines()
    out = []
    for i in rng.integers(0, len(lines), size=n):
        rec = json.loads(lines[i])
        text = rec["text"].split()
        picks = rng.choice(len(text), size=int(rng.integers(1, 5)), replace=False)
        out.append(" ".join(rec["title"].split()[:1] + [text[j] for j in picks]))
    return out


def summarize(name: str, lat_s: list[float], wall_s: float) -> dict:
    ms = np.asarray(lat_s) * 1000
    return {
        "name": name,
        "p50": float(np.percentile(ms, 50)),
        "p95": float(np.percentile(ms, 95)),
        "qps": len(lat_s) / wall_s,
    }


def time_sync(name: str, fn, queries: list[str]) -> dict:
    lat = []
    t0 = time.perf_counter()
    for q in queries:
        t = time.perf_counter()
        fn(q)
        lat.append(time.perf_counter() - t)
    return summarize(name, lat, time.perf_counter() - t0)


async def time_async(name: str, tool, queries: list[str], concurrency: int = 1) -> dict:
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(q: str) -> None:
        async with sem:
            t = time.perf_counter()
            res = await tool(q)
            lat.append(time.perf_counter() - t)
            assert res.ok, res.error

    t0 = time.perf_counter()
    await asyncio.gather(*(one(q) for q in queries))
    return summarize(name, lat, time.perf_counter() - t0)


async def run(args: argparse.Namespace) -> None:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="agentenv-bench-search-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"synthetic-{args.passages}.jsonl"
    t0 = time.perf_counter()
    reused = corpus.exists()
    if not reused:
        make_corpus(corpus, args.passages)
    made = "reused" if reused else f"generated in {time.perf_counter() - t0:.1f} s"
    # Always measure a cold index build and an empty cache.
    for old in [*work.glob(corpus.name + ".bm25*"), *work.glob("cache.sqlite*")]:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    queries = make_queries(corpus, args.queries)

    t0 = time.perf_counter()
    built = BM25Retriever.from_corpus(corpus)
    build_total_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    retriever = BM25Retriever.from_corpus(corpus)
    load_s = time.perf_counter() - t0
    assert retriever.loaded and not built.loaded

    k, cut = 10, 1000
    tool = LocalSearchTool(retriever, k=k, max_chars=cut)
    cache = SearchCache(work / "cache.sqlite")
    cached = CachedSearchTool(tool, cache)

    rows = []
    rows.append(time_sync("BM25 search (direct call, k=10)", lambda q: retriever.search(q, k), queries))
    rows.append(await time_async("LocalSearchTool (await, one at a time)", tool, queries))
    rows.append(await time_async(f"LocalSearchTool ({args.concurrency} concurrent)", tool, queries, args.concurrency))
    unique = [f"{q} #{i}" for i, q in enumerate(queries)]  # never seen: every call misses
    rows.append(await time_async("cache miss (BM25 + SQLite write)", cached, unique))
    rows.append(await time_async("cache hit (SQLite read)", cached, unique))
    rows.append(await time_async(f"cache hit ({args.concurrency} concurrent)", cached, unique, args.concurrency))
    assert cache.hits == 2 * len(unique), cache.stats()

    hits = [len(retriever.search(q, k)) for q in queries[:50]]
    print(f"corpus: {args.passages:,} passages ({corpus.stat().st_size / 1e6:.0f} MB, {made}), "
          f"{len(queries)} queries, k={k}, cut={cut}, mean hits {statistics.mean(hits):.1f}\n")
    print("| measurement | p50 (ms) | p95 (ms) | queries/s |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['p50']:.2f} | {r['p95']:.2f} | {r['qps']:.0f} |")
    print()
    print("| index | seconds |")
    print("|---|---:|")
    print(f"| BM25 build (tokenize + index, {args.passages:,} passages) | {built.build_s:.1f} |")
    print(f"| first load: read corpus + build + save | {build_total_s:.1f} |")
    print(f"| reload: read corpus + hash + load saved index | {load_s:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workdir", default=None, help="where the corpus, index and cache go (default: a temp dir)")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
