"""Passage selection: the most relevant window within the budget."""

from __future__ import annotations

import random

import pytest

from agentenv.tools.browser import select_passage
from agentenv.tools.browser.select import split_units, terms

WORDS = "river mountain city history music people market season forest harbor bridge village".split()


def filler(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(10)).capitalize() + "." for _ in range(n)]


def test_terms_drop_stopwords_and_plural_s():
    assert terms("What were the Towers of the city?") == ["tower", "city"]
    assert terms("glass class") == ["glass", "class"]


def test_units_cover_the_text_and_respect_the_cap():
    text = "One. Two!  Three?\n\nFour " + "x" * 1000 + " " + "word " * 300
    spans = split_units(text, 400)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous
    assert all(e - s <= 400 for s, e in spans)


def test_short_text_is_returned_whole():
    sel = select_passage("A short page about rivers.", "rivers", 6000)
    assert sel.text == "A short page about rivers." and sel.start == 0 and sel.matched == ("river",)


@pytest.mark.parametrize("budget", [300, 1000, 6000])
def test_needle_found_centered_and_within_budget(budget):
    needle = "The Zephyr observatory launch code is 7731-ALPHA."
    sents = filler(3000)
    sents.insert(2100, needle)
    text = " ".join(sents)
    sel = select_passage(text, "launch code of the Zephyr observatory", budget)
    assert needle in sel.text
    assert len(sel.text) <= budget
    assert text[sel.start : sel.end].strip() == sel.text
    pos = sel.text.index(needle) + len(needle) / 2
    assert abs(pos / len(sel.text) - 0.5) < 0.35  # the match sits in the middle of its context


def test_window_covering_all_terms_beats_repetition_of_one():
    rep = " ".join(["The zephyr zephyr zephyr zephyr."] * 3)
    cover = "The zephyr observatory published its launch code."
    text = " ".join(filler(200) + [rep] + filler(200, seed=1) + [cover] + filler(200, seed=2))
    sel = select_passage(text, "zephyr observatory launch code", 400)
    assert cover in sel.text and rep not in sel.text


def test_no_match_keeps_the_start():
    text = " ".join(filler(500))
    sel = select_passage(text, "quantum chromodynamics", 1000)
    assert sel.start == 0 and sel.score == 0.0 and text.startswith(sel.text) and len(sel.text) <= 1000
