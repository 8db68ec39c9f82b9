"""BM25 retriever and LocalSearchTool on a small hand-made corpus."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from agentenv.errors import ToolError
from agentenv.tools.base import Tool
from agentenv.tools.search import BM25Retriever, LocalSearchTool, Passage, format_pages

PASSAGES = [
    {"id": "p0", "title": "Zorvath Castle", "text": "Zorvath Castle was built by the mason Elira Quent in 1312."},
    {"id": "p1", "title": "Elira Quent", "text": "Elira Quent was born in the river town of Maddox."},
    {"id": "p2", "title": "Maddox", "text": "Maddox is a town on the Brill river, famous for its copper bells."},
    {"id": "p3", "title": "Copper", "text": "Copper is a metal. " + "Bells ring. " * 300},
    {"id": "p4", "title": "Brill", "text": "The Brill river flows north into the Cold Sea."},
]


def write_corpus(path, passages=PASSAGES):
    with open(path, "w") as f:
        for p in passages:
            f.write(json.dumps(p) + "\n")
    return path


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.jsonl")


def test_ranking_puts_the_answering_passage_first(corpus):
    r = BM25Retriever.from_corpus(corpus)
    assert [p.id for p in r.search("who built Zorvath Castle", 3)][0] == "p0"
    assert r.search("where was Elira Quent born", 3)[0].id == "p1"
    assert r.search("Brill river flows", 1)[0].id == "p4"
    assert r.search("xylophone quasar", 5) == []  # no known term: nothing, not everything


def test_top_k_and_scores_descending(corpus):
    r = BM25Retriever.from_corpus(corpus)
    hits = r.search("Maddox Brill river town Elira", 2)
    assert len(hits) == 2
    assert hits[0].score >= hits[1].score > 0
    assert len(r.search("river", 10)) == 3  # only the passages that mention it (p1 says "river town")


def test_format_pages_blocks_and_cut():
    ps = [Passage("T1", "a" * 1500), Passage("T2", "short")]
    text = format_pages(ps, max_chars=1000)
    blocks = text.split("\n\n")
    assert blocks[0] == "Page 1: T1\n" + "a" * 1000
    assert blocks[1] == "Page 2: T2\nshort"
    assert format_pages(ps[1:], max_chars=3) == "Page 1: T2\nsho"


async def test_tool_formats_results_with_cut(corpus):
    tool = LocalSearchTool.from_corpus(corpus, k=10)
    assert isinstance(tool, Tool) and tool.name == "search"
    res = await tool("copper metal")
    assert res.ok and res.error is None
    assert res.metadata["ids"] == ["p2", "p3"]  # p3's length normalization puts the short passage first
    blocks = res.text.split("\n\n")
    assert blocks[0] == "Page 1: Maddox\n" + PASSAGES[2]["text"]
    assert blocks[1].startswith("Page 2: Copper\nCopper is a metal.")
    assert len(blocks[1]) == len("Page 2: Copper\n") + 1000  # p3's 3,619 characters cut to 1,000
    assert res.metadata["num_results"] == len(blocks) == 2


async def test_k_and_cut_are_configurable(corpus):
    tool = LocalSearchTool.from_corpus(corpus, k=1, max_chars=10)
    res = await tool("river")
    assert res.text.count("Page ") == 1
    title, text = res.text.split("\n", 1)
    assert title.startswith("Page 1: ") and len(text) == 10


async def test_empty_query_is_a_readable_error(corpus):
    tool = LocalSearchTool.from_corpus(corpus)
    for q in ("", "   \n"):
        res = await tool(q)
        assert not res.ok and "Empty search query" in res.error
    res = await tool("zzzzqqq")
    assert res.ok and "No results found" in res.text


async def test_fork_returns_self_and_calls_run_concurrently(corpus):
    tool = LocalSearchTool.from_corpus(corpus)
    assert tool.fork() is tool
    results = await asyncio.gather(*(tool(q) for q in ["Maddox", "Zorvath", "Brill"] * 5))
    assert all(r.ok for r in results)
    assert results[1].metadata["ids"][0] == "p0"
    await tool.aclose()


def test_missing_corpus_names_path_and_how_to_make_one(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ToolError) as ei:
        BM25Retriever.from_corpus(missing)
    assert str(missing) in str(ei.value) and "JSONL" in str(ei.value)


def test_malformed_corpus_line_names_the_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": "1", "title": "t", "text": "ok"}\n{"id": 2, "title": "t"}\n')
    with pytest.raises(ToolError, match=r"bad.jsonl:2"):
        BM25Retriever.from_corpus(p)


def test_index_saved_reused_and_rebuilt_on_change(corpus):
    r1 = BM25Retriever.from_corpus(corpus)
    index_dir = corpus.with_name("corpus.jsonl.bm25")
    assert not r1.loaded and (index_dir / "manifest.json").is_file()
    stamp = os.stat(index_dir / "manifest.json").st_mtime_ns

    r2 = BM25Retriever.from_corpus(corpus)
    assert r2.loaded and r2.build_s == 0.0
    assert os.stat(index_dir / "manifest.json").st_mtime_ns == stamp
    assert [p.id for p in r2.search("Elira Quent", 5)] == [p.id for p in r1.search("Elira Quent", 5)]

    # Same size, new content: the hash notices.
    changed = [dict(p) for p in PASSAGES]
    changed[4] = {"id": "p4", "title": "Brilx", "text": "The Brilx river flows north into the Cold Sea."}
    time.sleep(0.01)
    write_corpus(corpus, changed)
    r3 = BM25Retriever.from_corpus(corpus)
    assert not r3.loaded
    assert r3.search("Brilx", 1)[0].id == "p4"
    assert BM25Retriever.from_corpus(corpus).loaded


def test_damaged_index_is_rebuilt(corpus):
    BM25Retriever.from_corpus(corpus)
    index_dir = corpus.with_name("corpus.jsonl.bm25")
    for f in index_dir.glob("*.npy"):
        f.write_bytes(b"garbage")
    r = BM25Retriever.from_corpus(corpus)
    assert not r.loaded and r.search("Maddox", 1)[0].id == "p2"


def test_contents_style_corpus(tmp_path):
    p = tmp_path / "wiki.jsonl"
    p.write_text(json.dumps({"id": "9", "contents": '"Ada Lovelace"\nAda wrote the first program.'}) + "\n")
    hit = BM25Retriever.from_corpus(p).search("first program", 1)[0]
    assert (hit.title, hit.text, hit.id) == ("Ada Lovelace", "Ada wrote the first program.", "9")
