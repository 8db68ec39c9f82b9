"""Toy task generator: determinism, disjoint splits, correct answers, BM25-findable facts."""

from __future__ import annotations

import json
import re

import pytest

from agentenv.errors import ConfigError
from agentenv.toy.tasks import (
    TOY_SYSTEM_PROMPT,
    ToyConfig,
    build_toy_suite,
    load_toy_tasks,
    reference_turns,
    write_corpus,
)

SMALL = ToyConfig(
    seed=3, n_arith_train=200, n_arith_heldout=50, n_twohop_train=150, n_twohop_heldout=40,
    n_both_train=150, n_both_heldout=40,
)  # fmt: skip


@pytest.fixture(scope="module")
def suite():
    return build_toy_suite(SMALL)


def _names(suite) -> set[str]:
    kb = suite.kb
    return {*kb.countries, *kb.cities, *kb.people, *kb.companies}


def test_sizes_ids_and_prompt(suite):
    for split, tasks in (("train", suite.train), ("heldout", suite.heldout)):
        for kind in ("arith", "twohop", "both"):
            got = [t for t in tasks if t.metadata["kind"] == kind]
            assert len(got) == SMALL.size(kind, split)
            assert [t.id for t in got] == [f"toy-{kind}-{split}-{i:05d}" for i in range(len(got))]
            assert all(t.metadata["split"] == split for t in got)
            assert all(t.ability == ("qa" if kind == "twohop" else "math") for t in got)
    t = suite.train[0]
    assert t.messages[0] == {"role": "system", "content": TOY_SYSTEM_PROMPT}
    assert t.messages[1]["role"] == "user" and t.question.endswith("?")
    assert len({t.id for t in suite.train + suite.heldout}) == len(suite.train) + len(suite.heldout)


def test_same_seed_same_suite_other_seed_differs(suite):
    again = build_toy_suite(SMALL)
    assert [(t.id, t.question, t.ground_truth, t.metadata) for t in again.train + again.heldout] == [
        (t.id, t.question, t.ground_truth, t.metadata) for t in suite.train + suite.heldout
    ]
    assert again.corpus_records() == suite.corpus_records()
    other = build_toy_suite(ToyConfig(seed=4, **{k: getattr(SMALL, k) for k in ("n_arith_train", "n_twohop_train")}))
    assert {t.question for t in other.train} != {t.question for t in suite.train}


def test_larger_sizes_only_append():
    small = load_toy_tasks(split="heldout", seed=1, n=12)
    large = load_toy_tasks(split="heldout", seed=1, n=30)
    assert [t.question for t in large[:12]] == [t.question for t in small]
    assert [t.metadata["kind"] for t in small[:6]] == ["arith", "twohop", "both"] * 2


def test_splits_are_disjoint(suite):
    train_q = {t.question for t in suite.train}
    assert not train_q & {t.question for t in suite.heldout}
    # Held-out questions name no entity (and have no answer or step value) that any train question uses.
    kb = suite.kb
    names = _names(suite)

    any_name = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")

    def mentioned(tasks):
        out = set()
        for t in tasks:
            steps = [s["query"] + " " + s["expect"] for s in t.metadata["solution"]]
            text = " ".join([t.question, t.ground_truth, *steps])
            out |= set(any_name.findall(text))
        return out

    held = mentioned([t for t in suite.heldout if t.metadata["kind"] != "arith"])
    train = mentioned([t for t in suite.train if t.metadata["kind"] != "arith"])
    assert held and train and not held & train
    for n in held:
        world = next(table[n].world for table in (kb.countries, kb.cities, kb.people, kb.companies) if n in table)
        assert world == "heldout"


def test_arith_split_disjoint_whatever_the_sizes():
    a = build_toy_suite(ToyConfig(seed=5, n_arith_train=2000, n_arith_heldout=10, n_twohop_train=0, n_both_train=0))
    b = build_toy_suite(ToyConfig(seed=5, n_arith_train=10, n_arith_heldout=300, n_twohop_train=0, n_both_train=0))
    train = {t.question for t in a.train + b.train}
    held = {t.question for t in a.heldout + b.heldout if t.metadata["kind"] == "arith"}
    assert len(held) >= 300 and not train & held


def test_answers_are_correct(suite):
    kb = suite.kb
    for t in suite.train + suite.heldout:
        kind, sol = t.metadata["kind"], t.metadata["solution"]
        if kind == "arith":
            a, op, b = re.fullmatch(r"What is (\d+) ([*+-]) (\d+)\?", t.question).groups()
            assert 100 <= int(a) <= 99999 and 100 <= int(b) <= 99999
            assert int(t.ground_truth) == eval(f"{a} {op} {b}")  # noqa: S307 (digits and one operator)
            assert sol == [{"tool": "python", "query": f"print({a} {op} {b})", "expect": t.ground_truth}]
        elif kind == "twohop":
            assert [s["tool"] for s in sol] == ["search", "search"]
            assert sol[-1]["expect"] == t.ground_truth
            m = re.fullmatch(r"In which city was the founder of (.+) born\?", t.question)
            if m:
                assert t.ground_truth == kb.people[kb.companies[m[1]].founder].born_in
            m = re.fullmatch(r"In which country was (.+) born\?", t.question)
            if m:
                assert t.ground_truth == kb.cities[kb.people[m[1]].born_in].country
            m = re.fullmatch(r"What is the capital of the country where (.+) is\?", t.question)
            if m:
                assert t.ground_truth == kb.countries[kb.cities[m[1]].country].capital != m[1]
        else:
            assert [s["tool"] for s in sol][-1] == "python" and "search" in [s["tool"] for s in sol]
            code = sol[-1]["query"]
            assert str(eval(re.fullmatch(r"print\((.+)\)", code)[1])) == t.ground_truth  # noqa: S307
            m = re.fullmatch(r"What is the population of (.+) times (\d)\?", t.question)
            if m:
                assert int(t.ground_truth) == kb.cities[m[1]].population * int(m[2])
            m = re.fullmatch(r"How many years apart were (.+) and (.+) founded\?", t.question)
            if m:
                gap = abs(kb.companies[m[1]].founded - kb.companies[m[2]].founded)
                assert int(t.ground_truth) == gap > 0
    templates = {t.metadata["template"] for t in suite.train}
    assert {"founder_born", "person_country", "company_country", "city_capital"} <= templates
    assert {"founding_gap", "population_times", "population_sum"} <= templates


def test_names_unique_and_short(suite):
    kb = suite.kb
    words = [w for n in [*kb.countries, *kb.cities, *kb.people] for w in n.split()]
    words += [n.split()[0] for n in kb.companies]
    assert len(words) == len({w.lower() for w in words})
    assert all(w[0].isupper() and w[1:].islower() and w.isalpha() and len(w) <= 10 for w in words)


def test_every_reference_query_ranks_its_passage_first(suite):
    """BM25 (bm25s, English stopwords, no stemmer) over title+text puts the fact at rank 1, alone."""
    import bm25s

    recs = suite.corpus_records()
    assert len({r["id"] for r in recs}) == len(recs) and all(set(r) == {"id", "title", "text"} for r in recs)
    ret = bm25s.BM25()
    ret.index(bm25s.tokenize([r["title"] + " " + r["text"] for r in recs], stopwords="en", show_progress=False),
              show_progress=False)  # fmt: skip
    steps = [s for t in suite.train + suite.heldout for s in t.metadata["solution"] if s["tool"] == "search"]
    assert len(steps) > 300
    docs, scores = ret.retrieve(
        bm25s.tokenize([s["query"] for s in steps], stopwords="en", show_progress=False), k=2, show_progress=False
    )
    for s, d, sc in zip(steps, docs, scores, strict=True):
        assert s["expect"] in recs[d[0]]["text"], s
        assert sc[0] > sc[1], s
    # A query made of the question's own words finds the first hop's fact in the top 3.
    asked = [t for t in suite.train + suite.heldout if t.metadata["kind"] != "arith"]
    docs, _ = ret.retrieve(
        bm25s.tokenize([t.question for t in asked], stopwords="en", show_progress=False), k=3, show_progress=False
    )
    for t, d in zip(asked, docs, strict=True):
        first = next(s for s in t.metadata["solution"] if s["tool"] == "search")
        assert any(first["expect"] in recs[i]["text"] for i in d), t.question


def test_write_corpus_roundtrip(tmp_path, suite):
    path = write_corpus(suite.kb, tmp_path / "sub" / "corpus.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == suite.corpus_records()
    assert suite.write_corpus(tmp_path / "again.jsonl").read_text() == path.read_text()
    # Distractors are there and state no asked fact.
    relation = re.compile(r"founder|founded|born|based|country|capital|population")
    distractors = [r for r in rows if not relation.search(r["text"])]
    assert len(distractors) == SMALL.kb_distractors


def test_reference_turns_format(suite):
    by_kind = {t.metadata["kind"]: t for t in suite.train}
    twohop = by_kind["twohop"]
    turns = reference_turns(twohop)
    sol = twohop.metadata["solution"]
    assert len(turns) == 3
    for turn, step in zip(turns, sol, strict=False):
        assert re.fullmatch(r"<think>[^<]+</think><search>[^<]+</search>", turn)
        assert turn.endswith(f"<search>{step['query']}</search>")
    assert sol[0]["expect"] in turns[1].split("</think>")[0]  # the next turn reads the first hop's finding
    assert turns[-1].endswith(f"<answer>\\boxed{{{twohop.ground_truth}}}</answer>")
    arith = reference_turns(by_kind["arith"])
    assert len(arith) == 2 and arith[0].endswith("</python>") and "<python>print(" in arith[0]
    both = reference_turns(by_kind["both"])
    assert both[-2].endswith("</python>") and "</search>" in both[0]


def test_reference_turns_checks_results(suite):
    t = next(t for t in suite.train if t.metadata["kind"] == "twohop")
    sol = t.metadata["solution"]
    ok = [f"<result>\nPage 1: x\n{s['expect']} here\n</result>" for s in sol]
    assert reference_turns(t, ok) == reference_turns(t)
    with pytest.raises(ValueError, match="does not contain"):
        reference_turns(t, [ok[0], "<result>\nnothing\n</result>"])
    with pytest.raises(ValueError, match="results"):
        reference_turns(t, ok[:1])


def test_config_validation():
    with pytest.raises(ConfigError, match="heldout_fraction"):
        ToyConfig(heldout_fraction=1.0)
    with pytest.raises(ConfigError, match="n_arith_train"):
        ToyConfig(n_arith_train=-1)
    with pytest.raises(ConfigError, match="kb_people"):
        ToyConfig(kb_people=10, kb_companies=100)
    with pytest.raises(ConfigError, match="arith_ops"):
        ToyConfig(arith_ops=("/",))
    with pytest.raises(ConfigError, match="n_twohop_heldout.*only"):
        build_toy_suite(ToyConfig(n_twohop_heldout=10_000))
    with pytest.raises(ConfigError, match="kinds"):
        load_toy_tasks(kinds=("riddle",))


def test_balanced_subset_takes_every_kind_in_turn():
    from agentenv.tasks import Task, balanced_subset

    def t(i, kind):
        return Task(id=f"{kind}{i}", messages=({"role": "user", "content": "q"},), ground_truth="a",
                    metadata={"kind": kind})  # fmt: skip

    tasks = [t(0, "a"), t(1, "a"), t(2, "a"), t(0, "b"), t(1, "b"), t(0, "c")]
    assert [x.id for x in balanced_subset(tasks, 4)] == ["a0", "b0", "c0", "a1"]
    assert [x.id for x in balanced_subset(tasks, 5)] == ["a0", "b0", "c0", "a1", "b1"]
    assert balanced_subset(tasks, None) == tasks == balanced_subset(tasks, 99)
    # the toy held-out split is grouped by kind: its first 150 would miss a kind, a balanced 150 does not
    from agentenv.toy.tasks import ToyConfig, build_toy_suite

    heldout = build_toy_suite(ToyConfig()).heldout
    kinds = {x.metadata["kind"] for x in heldout}
    assert {x.metadata["kind"] for x in balanced_subset(heldout, 150)} == kinds


def test_with_kb_scale_multiplies_every_knowledge_base_count():
    from agentenv.toy.tasks import ToyConfig

    base = ToyConfig(seed=3, n_arith_train=7)
    big = base.with_kb_scale(3)
    assert (big.seed, big.n_arith_train) == (3, 7)
    assert (big.kb_countries, big.kb_people, big.kb_distractors) == (
        3 * base.kb_countries, 3 * base.kb_people, 3 * base.kb_distractors
    )
    assert big.kb_cities == 3 * base.kb_cities and big.kb_companies == 3 * base.kb_companies


def test_solver_per_kind_mixes_kinds_the_split_lists_one_after_the_other(suite):
    """The train split lists its kinds in turn, so SFT's first N solved tasks are one kind; `per_kind` solves only
    each kind's first ones, so the first examples mix the kinds (each solved as without the option)."""
    from agentenv.envs.testing import EchoTool
    from agentenv.toy.solver import solve
    from agentenv.training.sft_data import solve_tasks

    tools = {n: EchoTool(n) for n in ("search", "python")}
    train = [t for t in suite.train if t.metadata["kind"] in ("twohop", "both")]
    assert train[SMALL.n_twohop_train - 1].metadata["kind"] == "twohop"  # kind after kind: 150 twohop first
    first = solve_tasks(solve, train, tools, "hermes", {"explain": False}, 6)
    assert {c.task.metadata["kind"] for c in first} == {"twohop"}
    mixed = solve_tasks(solve, train, tools, "hermes", {"explain": False, "per_kind": 3}, 6)
    want = [f"toy-{k}-train-{i:05d}" for k in ("twohop", "both") for i in range(3)]
    assert [c.task.id for c in mixed] == want
    for c in mixed:
        assert list(c.turns) == solve(c.task, tools, "hermes", explain=False)
    assert solve(train[3], tools, "hermes", per_kind=3) is None
