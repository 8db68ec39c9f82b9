"""Keep the passage of a page that matters to the goal.

The page is cut into sentence units. A window of consecutive units, at most
`max_chars` long, is scored like a BM25 document against the goal: each goal
term t adds idf(t) * tf(t) * (k1 + 1) / (tf(t) + k1), with tf counted over the
window (windows all have about the same length, so BM25's length norm drops
out) and idf over the units. Saturation makes a window that mentions every goal
term beat one that repeats a single term. The best window is then trimmed to
its scoring core and grown evenly on both sides up to the budget, so the match
sits in the middle of its context.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_STOPWORDS = frozenset(
    "a about an and are as at be been but by can could did do does for from had has have how i if in into is it "
    "its me my no not of on or our so such that the their them then there these they this to was we were what "
    "when where which who whom whose why will with would you your".split()
)
K1 = 1.2
MAX_UNIT_CHARS = 400


@dataclass(frozen=True)
class Selection:
    """A passage cut from a page.

    Attributes:
        text: The passage.
        start: Its first character's offset in the page text.
        end: Offset one past its last character.
        score: Its BM25 score against the goal (0.0 when nothing matched).
        matched: Goal terms found in the passage.
    """

    text: str
    start: int
    end: int
    score: float
    matched: tuple[str, ...] = ()


def _norm(w: str) -> str | None:
    if w in _STOPWORDS:
        return None
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def terms(text: str) -> list[str]:
    """Lowercase word terms without stopwords, with a crude plural strip ("towers" ~ "tower")."""
    return [t for t in map(_norm, _WORD.findall(text.lower())) if t is not None]


def split_units(text: str, max_unit_chars: int = MAX_UNIT_CHARS) -> list[tuple[int, int]]:
    """Sentence spans `(start, end)` covering `text`; long sentences cut at spaces."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for m in _SENTENCE_END.finditer(text):
        _add_span(text, pos, m.end(), max_unit_chars, spans)
        pos = m.end()
    _add_span(text, pos, len(text), max_unit_chars, spans)
    return spans


def _add_span(text: str, start: int, end: int, cap: int, out: list[tuple[int, int]]) -> None:
    while end - start > cap:
        cut = text.rfind(" ", start + cap // 2, start + cap)
        cut = cut + 1 if cut > start else start + cap
        out.append((start, cut))
        start = cut
    if end > start:
        out.append((start, end))


def select_passage(text: str, goal: str, max_chars: int) -> Selection:
    """The window of `text`, at most `max_chars` long, most relevant to `goal`.

    A text that fits is returned whole; with no goal term on the page, its start.
    """
    if len(text) <= max_chars:
        return Selection(text, 0, len(text), 0.0, tuple(sorted(set(terms(goal)) & set(terms(text)))))
    spans = split_units(text, min(MAX_UNIT_CHARS, max_chars // 2))
    query = set(terms(goal))
    low = text.lower()
    if len(low) == len(text):
        unit_words = [_WORD.findall(low, s, e) for s, e in spans]
    else:  # lowercasing changed offsets ("İ" -> "i̇"): lower unit by unit
        unit_words = [_WORD.findall(text[s:e].lower()) for s, e in spans]
    # The surface forms that normalize to a goal term ("tower", "towers"); all other words are skipped.
    to_term = {w: t for t in query for w in (t, t + "s") if _norm(w) == t}
    # (num_units,) goal-term counts per unit; None for the (many) units without any.
    unit_tf = [Counter(hit) if (hit := [to_term[w] for w in ws if w in to_term]) else None for ws in unit_words]
    n = len(spans)
    df = Counter(t for tf in unit_tf if tf for t in tf)
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in df}
    if not idf:
        return _grow(text, spans, 0, 0, max_chars, 0.0, ())

    def score(tf: dict[str, int]) -> float:
        return sum(idf[t] * c * (K1 + 1) / (c + K1) for t, c in tf.items() if c)

    # Two pointers: for every right end j, the longest window [i, j] that fits.
    best = (-1.0, 0, 0)
    window: dict[str, int] = dict.fromkeys(idf, 0)
    s, i = 0.0, 0
    for j in range(n):
        tf_j = unit_tf[j]
        changed = tf_j is not None
        if tf_j is not None:
            for t, c in tf_j.items():
                window[t] += c
        while spans[j][1] - spans[i][0] > max_chars:
            tf_i = unit_tf[i]
            if tf_i is not None:
                for t, c in tf_i.items():
                    window[t] -= c
                changed = True
            i += 1
        if changed:
            s = score(window)
        if s > best[0] + 1e-12:
            best = (s, i, j)
    s, i, j = best
    # Trim to the core that carries the score, then grow evenly around it.
    while i < j and unit_tf[i] is None:
        i += 1
    while j > i and unit_tf[j] is None:
        j -= 1
    matched = tuple(sorted(set().union(*(tf for tf in unit_tf[i : j + 1] if tf))))
    return _grow(text, spans, i, j, max_chars, s, matched)


def _grow(text: str, spans: list[tuple[int, int]], i: int, j: int, max_chars: int, s: float, matched: tuple[str, ...]) -> Selection:
    grew = True
    while grew:
        grew = False
        if i > 0 and spans[j][1] - spans[i - 1][0] <= max_chars:
            i -= 1
            grew = True
        if j + 1 < len(spans) and spans[j + 1][1] - spans[i][0] <= max_chars:
            j += 1
            grew = True
    start, end = spans[i][0], spans[j][1]
    return Selection(text[start:end].strip(), start, end, s, matched)
