"""The toy two-hop tasks are answerable: each hop's reference query ranks its answering passage in the top 3.

The dense variant lives in test_dense.py (it shares one encoder with the other dense tests).
"""

from __future__ import annotations

import pytest

from agentenv.tools.search import BM25Retriever
from agentenv.toy.tasks import ToyConfig, build_toy_suite

TOP = 3


@pytest.fixture(scope="module")
def suite():
    return build_toy_suite(ToyConfig(seed=0))


def gold_ids(records, step) -> set[str]:
    """Passages about the hop's subject (title named in the query) that state the expected answer."""
    return {r["id"] for r in records if r["title"] in step["query"] and step["expect"] in r["text"]}


def hops(suite):
    tasks = [t for t in suite.heldout if t.metadata["kind"] == "twohop"]
    assert len(tasks) >= 50
    return [s for t in tasks for s in t.metadata["solution"]]


def assert_ranked(retriever, records, steps):
    misses = []
    for step in steps:
        gold = gold_ids(records, step)
        assert gold, f"no passage answers {step}"
        top = [p.id for p in retriever.search(step["query"], TOP)]
        if not gold & set(top):
            misses.append((step["query"], step["expect"], top))
    assert misses == [], f"{len(misses)}/{len(steps)} hops miss their passage in the top {TOP}: {misses[:5]}"


def test_bm25_ranks_every_heldout_hop(suite, tmp_path):
    corpus = suite.write_corpus(tmp_path / "toy.jsonl")
    assert_ranked(BM25Retriever.from_corpus(corpus), suite.corpus_records(), hops(suite))
