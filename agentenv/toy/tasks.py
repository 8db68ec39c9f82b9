"""Toy tool-use tasks, generated from a seed, small enough for the tiny model.

Three kinds:

- `arith`: "What is 4821 * 917?" (needs the python tool; ability `math`).
- `twohop`: two searches over a generated fictional knowledge base, e.g.
  "In which city was the founder of Norvex Labs born?" (ability `qa`).
- `both`: searches for numbers, then python to combine them, e.g.
  "What is the population of Quenby times 3?" (ability `math`).

The knowledge base is two disjoint worlds (own countries, cities, people and
companies): train questions are asked only about the train world, held-out ones
only about the held-out world, so no entity of a held-out question (nor its
answer) appears in any train question. Both worlds go into one search corpus.
Arithmetic questions fall into a split by a hash of their text, so the splits
are disjoint whatever their sizes. Everything is a function of the seed, and
asking for more questions only appends to the list.
"""

from __future__ import annotations

import json
import math
import random
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from agentenv.errors import ConfigError
from agentenv.tasks.task import Task

# Short on purpose: the tiny model has a small context and learns from few examples.
TOY_SYSTEM_PROMPT = (
    "Answer the question. Think step by step inside <think></think>. "
    "To look up a fact, search with <search>query</search>. "
    "To compute, run code with <python>code</python>. "
    "Each tool result comes back in <result></result>. "
    "Give the final answer as <answer>\\boxed{...}</answer>."
)

Kind = Literal["arith", "twohop", "both"]
Split = Literal["train", "heldout"]
KINDS: tuple[Kind, ...] = ("arith", "twohop", "both")
GENERATOR_VERSION = 1
"""Bumped whenever the same config would generate different tasks or passages; put it in cache keys."""
SPLITS: tuple[Split, ...] = ("train", "heldout")


@dataclass(frozen=True)
class ToyConfig:
    """How many toy tasks of each kind and split, and how big a knowledge base.

    Attributes:
        seed: Seed of everything (names, facts, questions).
        n_arith_train: Arithmetic questions in the train split.
        n_arith_heldout: Arithmetic questions in the held-out split.
        n_twohop_train: Two-search questions in the train split.
        n_twohop_heldout: Two-search questions in the held-out split.
        n_both_train: Search-then-python questions in the train split.
        n_both_heldout: Search-then-python questions in the held-out split.
        kb_countries: Countries in the knowledge base (both worlds together).
        kb_cities: Cities (each country's first city is its capital).
        kb_people: People (each born in a city).
        kb_companies: Companies (each founded by a distinct person, in a year, based in a city).
        kb_distractors: Extra passages that mention entities but state no asked fact.
        heldout_fraction: Share of every entity type that forms the held-out world.
        arith_digits: Inclusive (min, max) digits of arithmetic operands.
        arith_ops: Operators of arithmetic questions.
    """

    seed: int = 0
    n_arith_train: int = 1000
    n_arith_heldout: int = 100
    n_twohop_train: int = 600
    n_twohop_heldout: int = 100
    n_both_train: int = 600
    n_both_heldout: int = 100
    kb_countries: int = 16
    kb_cities: int = 80
    kb_people: int = 400
    kb_companies: int = 240
    kb_distractors: int = 40
    heldout_fraction: float = 0.2
    arith_digits: tuple[int, int] = (3, 5)
    arith_ops: tuple[str, ...] = ("*", "+", "-")

    def __post_init__(self) -> None:
        # YAML gives lists; keep the config hashable and immutable.
        object.__setattr__(self, "arith_digits", tuple(self.arith_digits))
        object.__setattr__(self, "arith_ops", tuple(self.arith_ops))
        if len(self.arith_digits) != 2:
            raise ConfigError("arith_digits", f"must be (min, max), got {self.arith_digits}")
        for f in fields(self):
            if f.name.startswith(("n_", "kb_")) and getattr(self, f.name) < 0:
                raise ConfigError(f.name, f"must be >= 0, got {getattr(self, f.name)}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ConfigError("heldout_fraction", f"must be in (0, 1), got {self.heldout_fraction}")
        lo, hi = self.arith_digits
        if not 1 <= lo <= hi <= 9:
            raise ConfigError("arith_digits", f"needs 1 <= min <= max <= 9, got {self.arith_digits}")
        bad = [op for op in self.arith_ops if op not in ("*", "+", "-")]
        if bad or not self.arith_ops:
            raise ConfigError("arith_ops", f"must be a non-empty subset of ('*', '+', '-'), got {self.arith_ops}")
        for world in SPLITS:
            n = self.world_sizes(world)
            if n["countries"] < 1:
                raise ConfigError(
                    "kb_countries",
                    f"{self.kb_countries} leaves the {world} world no country "
                    f"(heldout_fraction {self.heldout_fraction})",
                )
            if n["cities"] < n["countries"]:
                raise ConfigError(
                    "kb_cities",
                    f"{world} world has {n['cities']} cities for {n['countries']} countries: "
                    "every country needs a capital",
                )
            if n["people"] < n["companies"]:
                raise ConfigError(
                    "kb_people",
                    f"{world} world has {n['people']} people for {n['companies']} companies: "
                    "every company needs its own founder",
                )

    def with_kb_scale(self, k: int) -> ToyConfig:
        """This config with a knowledge base `k` times larger (every `kb_*` count times `k`)."""
        return replace(self, **{f.name: getattr(self, f.name) * k for f in fields(self) if f.name.startswith("kb_")})

    def size(self, kind: Kind, split: Split) -> int:
        """Number of questions asked of `kind` in `split`."""
        return getattr(self, f"n_{kind}_{split}")

    def world_sizes(self, world: Split) -> dict[str, int]:
        """Entities of each type in one world (the held-out world takes a rounded share, at least 1)."""
        out = {}
        for key in ("countries", "cities", "people", "companies"):
            total = getattr(self, f"kb_{key}")
            held = min(total, max(1, round(total * self.heldout_fraction))) if total else 0
            out[key] = held if world == "heldout" else total - held
        return out


# ----------------------------------------------------------------------------- names

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "gr", "kr", "tr", "st", "th", "sh", "qu")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "n", "r", "l", "k", "m", "x", "nd", "rk", "sk", "rn", "lt")
_CITY_ENDS = ("by", "ton", "mere", "ford", "vik", "holm", "wick", "dale")
_COUNTRY_ENDS = ("ia", "ar", "and", "esh")
_COMPANY_SUFFIXES = ("Labs", "Inc", "Works", "Group", "Systems", "Motors")


def _syllable(rng: random.Random, coda: bool) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS) if coda else "")


class _NameMaker:
    """Draws capitalised names whose words are unique across the whole knowledge base.

    Words are also kept apart after a crude stemming (trailing e/y/i/s dropped), so
    a stemming BM25 tokenizer cannot merge two names either.
    """

    def __init__(self, rng: random.Random, reserved: Iterable[str]):
        self.rng = rng
        self.used: set[str] = {self._key(w) for w in reserved}

    @staticmethod
    def _key(word: str) -> str:
        return word.lower().rstrip("eyis")

    def _unique(self, make: Callable[[], str]) -> str:
        for _ in range(10_000):
            word = make()
            key = self._key(word)
            if len(key) >= 3 and key not in self.used:
                self.used.add(key)
                return word.capitalize()
        raise ConfigError("kb_people", "ran out of distinct names; lower the knowledge base sizes")

    def word(self) -> str:
        """Two syllables, e.g. Velor."""
        return self._unique(lambda: _syllable(self.rng, False) + _syllable(self.rng, True))

    def person(self) -> str:
        return f"{self.word()} {self.word()}"

    def company(self) -> str:
        return f"{self.word()} {self.rng.choice(_COMPANY_SUFFIXES)}"

    def city(self) -> str:
        return self._unique(lambda: _syllable(self.rng, True) + self.rng.choice(_CITY_ENDS))

    def country(self) -> str:
        rng = self.rng
        return self._unique(lambda: _syllable(rng, False) + rng.choice(_ONSETS) + rng.choice(_COUNTRY_ENDS))


# ----------------------------------------------------------------------------- knowledge base

# One passage per fact. Each passage holds the words its reference query uses
# ("founder of X" -> "The founder of X is ..."), so BM25 ranks it first.
_FACT_TEXT = {
    "capital": "The capital of {country} is {city}.",
    "country": "{city} is a city in the country {country}.",
    "population": "The population of {city} is {population}.",
    "born": "{person} was born in {city}.",
    "founder": "The founder of {company} is {person}.",
    "founded": "{company} was founded in {year}.",
    "based": "{company} is based in {city}.",
}
# Distractors name an entity but no asked relation, so they only ever rank below the fact.
_DISTRACTOR_TEXT = (
    "{person} enjoys {thing} and long walks.",
    "{city} is known for its {thing}.",
    "{company} makes {thing} for shops.",
    "{country} has many {thing} in the north.",
)
_THINGS = ("rivers", "bridges", "markets", "lamps", "boats", "gardens", "kites", "bells", "maps", "clocks")


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    world: Split


@dataclass(frozen=True)
class City:
    name: str
    country: str
    population: int
    world: Split


@dataclass(frozen=True)
class Person:
    name: str
    born_in: str
    world: Split


@dataclass(frozen=True)
class Company:
    name: str
    founder: str
    founded: int
    based_in: str
    world: Split


@dataclass
class ToyKB:
    """A fictional world of countries, cities, people and companies, and its passages.

    Attributes:
        countries, cities, people, companies: Entities by name (both worlds).
        passages: Corpus records `{"id", "title", "text"}`: one per fact, plus distractors.
    """

    countries: dict[str, Country] = field(default_factory=dict)
    cities: dict[str, City] = field(default_factory=dict)
    people: dict[str, Person] = field(default_factory=dict)
    companies: dict[str, Company] = field(default_factory=dict)
    passages: list[dict[str, str]] = field(default_factory=list)

    def in_world(self, table: dict[str, Any], world: Split) -> list[Any]:
        """Entities of one table that belong to `world`, in creation order."""
        return [e for e in table.values() if e.world == world]


def _reserved_words() -> set[str]:
    words: set[str] = set()
    texts = [*_FACT_TEXT.values(), *_DISTRACTOR_TEXT, *_THINGS, *_COMPANY_SUFFIXES,
             *_TWOHOP_QUESTIONS.values(), *_BOTH_QUESTIONS.values()]  # fmt: skip
    for text in texts:
        for w in text.replace("{", " ").replace("}", " ").replace("?", " ").replace(".", " ").split():
            words.add(w.lower())
    return words


def build_kb(cfg: ToyConfig) -> ToyKB:
    """Generate the knowledge base (both worlds) and its passages from `cfg.seed`."""
    rng = random.Random(f"toy-kb-{cfg.seed}")
    names = _NameMaker(rng, _reserved_words())
    kb = ToyKB()
    for world in SPLITS:
        n = cfg.world_sizes(world)
        countries = [names.country() for _ in range(n["countries"])]
        cities: list[str] = []
        for i in range(n["cities"]):
            # The first len(countries) cities are the capitals, one per country.
            country = countries[i] if i < len(countries) else rng.choice(countries)
            city = names.city()
            cities.append(city)
            kb.cities[city] = City(city, country, rng.randint(10_000, 999_999), world)
        for i, country in enumerate(countries):
            kb.countries[country] = Country(country, cities[i], world)
        people = [names.person() for _ in range(n["people"])]
        for person in people:
            kb.people[person] = Person(person, rng.choice(cities), world)
        founders = rng.sample(people, n["companies"])
        for founder in founders:
            company = names.company()
            kb.companies[company] = Company(company, founder, rng.randint(1850, 2020), rng.choice(cities), world)
    kb.passages = _passages(kb, cfg.kb_distractors, rng)
    return kb


def _passages(kb: ToyKB, n_distractors: int, rng: random.Random) -> list[dict[str, str]]:
    facts: list[tuple[str, str]] = []  # (title, text)
    for c in kb.countries.values():
        facts.append((c.name, _FACT_TEXT["capital"].format(country=c.name, city=c.capital)))
    for ci in kb.cities.values():
        facts.append((ci.name, _FACT_TEXT["country"].format(city=ci.name, country=ci.country)))
        facts.append((ci.name, _FACT_TEXT["population"].format(city=ci.name, population=ci.population)))
    for p in kb.people.values():
        facts.append((p.name, _FACT_TEXT["born"].format(person=p.name, city=p.born_in)))
    for co in kb.companies.values():
        facts.append((co.name, _FACT_TEXT["founder"].format(company=co.name, person=co.founder)))
        facts.append((co.name, _FACT_TEXT["founded"].format(company=co.name, year=co.founded)))
        facts.append((co.name, _FACT_TEXT["based"].format(company=co.name, city=co.based_in)))
    tables: list[tuple[str, Mapping[str, Any]]] = [
        ("person", kb.people), ("city", kb.cities), ("company", kb.companies), ("country", kb.countries)
    ]
    for i in range(n_distractors):
        slot, table = tables[i % len(tables)]
        if not table:
            continue
        name = rng.choice(list(table))
        text = _DISTRACTOR_TEXT[i % len(_DISTRACTOR_TEXT)]
        facts.append((name, text.format(**{slot: name, "thing": rng.choice(_THINGS)})))
    rng.shuffle(facts)
    return [{"id": f"toy-kb-{i:05d}", "title": t, "text": x} for i, (t, x) in enumerate(facts)]


def write_corpus(kb: ToyKB, path: str | Path) -> Path:
    """Write the knowledge base's passages as a JSONL corpus (`id`, `title`, `text`).

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for rec in kb.passages:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path


# ----------------------------------------------------------------------------- questions

# A question draft: (question text, ground truth, solution steps, template name, think texts).
# thinks[i] opens turn i; thinks[-1] opens the answer turn.
@dataclass(frozen=True)
class _Draft:
    question: str
    answer: str
    solution: tuple[dict[str, str], ...]
    template: str
    thinks: tuple[str, ...]


def _search(query: str, expect: str) -> dict[str, str]:
    return {"tool": "search", "query": query, "expect": expect}


def _python(code: str, expect: str) -> dict[str, str]:
    return {"tool": "python", "query": code, "expect": expect}


_TWOHOP_QUESTIONS = {
    "founder_born": "In which city was the founder of {company} born?",
    "person_country": "In which country was {person} born?",
    "company_country": "In which country is {company} based?",
    "city_capital": "What is the capital of the country where {city} is?",
}
_BOTH_QUESTIONS = {
    "founding_gap": "How many years apart were {a} and {b} founded?",
    "population_times": "What is the population of {city} times {k}?",
    "population_sum": "What is the population of {a} plus the population of {b}?",
}


def _twohop_pools(kb: ToyKB, world: Split) -> dict[str, list[_Draft]]:
    q = _TWOHOP_QUESTIONS
    pools: dict[str, list[_Draft]] = {t: [] for t in q}
    for c in kb.in_world(kb.companies, world):
        p = kb.people[c.founder]
        pools["founder_born"].append(_Draft(
            q["founder_born"].format(company=c.name), p.born_in,
            (_search(f"founder of {c.name}", p.name), _search(f"{p.name} born", p.born_in)),
            "founder_born",
            (f"I need the founder of {c.name}.", f"The founder is {p.name}.", f"{p.name} was born in {p.born_in}."),
        ))  # fmt: skip
        country = kb.cities[c.based_in].country
        pools["company_country"].append(_Draft(
            q["company_country"].format(company=c.name), country,
            (_search(f"{c.name} based", c.based_in), _search(f"{c.based_in} country", country)),
            "company_country",
            (f"I need the city of {c.name}.", f"{c.name} is based in {c.based_in}.", f"{c.based_in} is in {country}."),
        ))  # fmt: skip
    for p in kb.in_world(kb.people, world):
        country = kb.cities[p.born_in].country
        pools["person_country"].append(_Draft(
            q["person_country"].format(person=p.name), country,
            (_search(f"{p.name} born", p.born_in), _search(f"{p.born_in} country", country)),
            "person_country",
            (f"I need where {p.name} was born.", f"{p.name} was born in {p.born_in}.", f"{p.born_in} is in {country}."),
        ))  # fmt: skip
    for c in kb.in_world(kb.cities, world):
        capital = kb.countries[c.country].capital
        if capital == c.name:  # "the capital of the country where X is" would be X itself
            continue
        pools["city_capital"].append(_Draft(
            q["city_capital"].format(city=c.name), capital,
            (_search(f"{c.name} country", c.country), _search(f"capital of {c.country}", capital)),
            "city_capital",
            (f"I need the country of {c.name}.", f"{c.name} is in {c.country}.",
             f"The capital of {c.country} is {capital}."),
        ))  # fmt: skip
    return pools


def _both_draft(kb: ToyKB, template: str, rng: random.Random, world: Split) -> _Draft:
    q = _BOTH_QUESTIONS
    if template == "founding_gap":
        a, b = rng.sample(kb.in_world(kb.companies, world), 2)
        gap = abs(a.founded - b.founded)
        return _Draft(
            q[template].format(a=a.name, b=b.name), str(gap),
            (_search(f"{a.name} founded", str(a.founded)), _search(f"{b.name} founded", str(b.founded)),
             _python(f"print(abs({a.founded} - {b.founded}))", str(gap))),
            template,
            (f"I need the year {a.name} was founded.", f"{a.name} was founded in {a.founded}.",
             f"{b.name} was founded in {b.founded}.", f"The result is {gap}."),
        )  # fmt: skip
    if template == "population_times":
        c = rng.choice(kb.in_world(kb.cities, world))
        k = rng.randint(2, 9)
        out = c.population * k
        return _Draft(
            q[template].format(city=c.name, k=k), str(out),
            (_search(f"population of {c.name}", str(c.population)), _python(f"print({c.population} * {k})", str(out))),
            template,
            (f"I need the population of {c.name}.", f"The population is {c.population}.", f"The result is {out}."),
        )  # fmt: skip
    a, b = rng.sample(kb.in_world(kb.cities, world), 2)
    out = a.population + b.population
    return _Draft(
        q[template].format(a=a.name, b=b.name), str(out),
        (_search(f"population of {a.name}", str(a.population)), _search(f"population of {b.name}", str(b.population)),
         _python(f"print({a.population} + {b.population})", str(out))),
        template,
        (f"I need the population of {a.name}.", f"The population of {a.name} is {a.population}.",
         f"The population of {b.name} is {b.population}.", f"The result is {out}."),
    )  # fmt: skip


def _arith_split(question: str) -> Split:
    """The split an arithmetic question belongs to: a fixed hash partition (1 in 8 held out)."""
    return "heldout" if zlib.crc32(question.encode()) % 8 == 0 else "train"


def _arith_drafts(cfg: ToyConfig, split: Split, n: int) -> list[_Draft]:
    rng = random.Random(f"toy-arith-{cfg.seed}-{split}")
    lo, hi = cfg.arith_digits
    out: list[_Draft] = []
    seen: set[str] = set()
    while len(out) < n:
        # Digits first, so short and long operands are equally common.
        da, db = rng.randint(lo, hi), rng.randint(lo, hi)
        a = rng.randint(10 ** (da - 1), 10**da - 1)
        b = rng.randint(10 ** (db - 1), 10**db - 1)
        op = rng.choice(cfg.arith_ops)
        question = f"What is {a} {op} {b}?"
        if question in seen or _arith_split(question) != split:
            continue
        seen.add(question)
        value = str(a * b if op == "*" else a + b if op == "+" else a - b)
        out.append(_Draft(
            question, value, (_python(f"print({a} {op} {b})", value),), f"arith_{op}",
            ("I will compute it with python.", f"The result is {value}."),
        ))  # fmt: skip
    return out


def _round_robin(pools: dict[str, list[_Draft]], n: int) -> list[_Draft]:
    """Take n drafts, one template after the other, so templates stay balanced."""
    queues = [list(p) for p in pools.values() if p]
    out: list[_Draft] = []
    i = 0
    while len(out) < n and any(queues):
        if queues[i % len(queues)]:
            out.append(queues[i % len(queues)].pop(0))
        i += 1
    return out


def _twohop_drafts(kb: ToyKB, cfg: ToyConfig, split: Split, n: int) -> list[_Draft]:
    rng = random.Random(f"toy-twohop-{cfg.seed}-{split}")
    pools = _twohop_pools(kb, split)
    for pool in pools.values():
        rng.shuffle(pool)
    available = sum(len(p) for p in pools.values())
    if n > available:
        raise ConfigError(
            f"n_twohop_{split}",
            f"asks for {n} questions but the {split} world has only {available} distinct ones; "
            "raise kb_people/kb_companies",
        )
    return _round_robin(pools, n)


def _both_drafts(kb: ToyKB, cfg: ToyConfig, split: Split, n: int) -> list[_Draft]:
    rng = random.Random(f"toy-both-{cfg.seed}-{split}")
    templates = list(_BOTH_QUESTIONS)
    need_two = {
        "founding_gap": len(kb.in_world(kb.companies, split)),
        "population_sum": len(kb.in_world(kb.cities, split)),
    }
    if n and min(need_two.values()) < 2:
        raise ConfigError(f"n_both_{split}", f"the {split} world needs >= 2 companies and >= 2 cities, has {need_two}")
    out: list[_Draft] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise ConfigError(f"n_both_{split}", f"asks for {n} questions; only {len(out)} distinct ones found")
        d = _both_draft(kb, templates[len(out) % len(templates)], rng, split)
        # A zero year gap reads as a trick question; skip it.
        if d.question in seen or d.answer == "0":
            continue
        seen.add(d.question)
        out.append(d)
    return out


# ----------------------------------------------------------------------------- suite


@dataclass
class ToySuite:
    """The knowledge base and the toy tasks of both splits.

    Attributes:
        config: The config the suite was built from.
        kb: The knowledge base (both worlds).
        train: Train tasks, kinds in the order arith, twohop, both.
        heldout: Held-out tasks, same order.
    """

    config: ToyConfig
    kb: ToyKB
    train: list[Task]
    heldout: list[Task]

    def corpus_records(self) -> list[dict[str, str]]:
        """The search corpus: `{"id", "title", "text"}` per passage."""
        return [dict(r) for r in self.kb.passages]

    def write_corpus(self, path: str | Path) -> Path:
        """Write the search corpus as JSONL; returns the path."""
        return write_corpus(self.kb, path)

    def split(self, split: Split) -> list[Task]:
        """The tasks of one split."""
        return self.train if split == "train" else self.heldout


def _task(kind: Kind, split: Split, index: int, d: _Draft, seed: int) -> Task:
    return Task(
        id=f"toy-{kind}-{split}-{index:05d}",
        messages=({"role": "system", "content": TOY_SYSTEM_PROMPT}, {"role": "user", "content": d.question}),
        ground_truth=d.answer,
        ability="qa" if kind == "twohop" else "math",
        metadata={
            "source": "toy",
            "kind": kind,
            "split": split,
            "template": d.template,
            "seed": seed,
            "solution": [dict(s) for s in d.solution],
            "thinks": list(d.thinks),
        },
    )


def build_toy_suite(cfg: ToyConfig | None = None) -> ToySuite:
    """Generate the knowledge base and every toy task the config asks for."""
    cfg = cfg or ToyConfig()
    kb = build_kb(cfg)
    out: dict[Split, list[Task]] = {}
    for split in SPLITS:
        tasks: list[Task] = []
        makers = {"arith": lambda s, n: _arith_drafts(cfg, s, n), "twohop": lambda s, n: _twohop_drafts(kb, cfg, s, n),
                  "both": lambda s, n: _both_drafts(kb, cfg, s, n)}  # fmt: skip
        for kind in KINDS:
            drafts = makers[kind](split, cfg.size(kind, split))
            tasks += [_task(kind, split, i, d, cfg.seed) for i, d in enumerate(drafts)]
        out[split] = tasks
    return ToySuite(cfg, kb, out["train"], out["heldout"])


def load_toy_tasks(
    kinds: Sequence[Kind] = KINDS, split: Split = "train", seed: int = 0, n: int | None = None
) -> list[Task]:
    """Toy tasks of some kinds from one split.

    Args:
        kinds: Which kinds, e.g. `("twohop",)`.
        split: `train` or `heldout`.
        seed: Generation seed.
        n: Total number of tasks, interleaved across kinds (kind order, round robin).
            None gives the default sizes of `ToyConfig`.

    Returns:
        The tasks. Same arguments give the same tasks; a larger n extends the list.
    """
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ConfigError("kinds", f"must be a non-empty subset of {KINDS}, got {kinds}")
    if split not in SPLITS:
        raise ConfigError("split", f"must be one of {SPLITS}, got {split!r}")
    if n is not None and n < 0:
        raise ConfigError("n", f"must be >= 0, got {n}")
    sizes: dict[str, Any] = {}
    if n is not None:
        per_kind = math.ceil(n / len(kinds))
        sizes = {f"n_{k}_{s}": 0 for k in KINDS for s in SPLITS}
        sizes.update({f"n_{k}_{split}": per_kind for k in kinds})
    suite = build_toy_suite(ToyConfig(seed=seed, **sizes))
    by_kind = {k: [t for t in suite.split(split) if t.metadata["kind"] == k] for k in kinds}
    if n is None:
        return [t for k in kinds for t in by_kind[k]]
    return _interleave([by_kind[k] for k in kinds])[:n]


def _interleave(lists: list[list[Task]]) -> list[Task]:
    out: list[Task] = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out


def reference_turns(task: Task, results: Sequence[str] | None = None) -> list[str]:
    """The policy turns of a correct solution of a toy task, in ARPO's tag format.

    Each tool turn is `<think>...</think><tool>query</tool>` (ending with the
    closing tag, where the env stops generation); the last turn is
    `<think>...</think><answer>\\boxed{X}</answer>`.

    Args:
        task: A toy task (from this module).
        results: The text each tool call returned when the turns were run through
            a real environment, one per tool turn. Where given, each must contain the
            value the next turn relies on, else the trace would teach a wrong step.

    Returns:
        The text of each policy turn (tool turns, then the answer turn).

    Raises:
        ValueError: Not a toy task, or a result lacks the value it should contain.
    """
    solution = task.metadata.get("solution")
    thinks = task.metadata.get("thinks")
    if solution is None or thinks is None or len(thinks) != len(solution) + 1:
        raise ValueError(f"task {task.id} is not a toy task (metadata lacks 'solution'/'thinks')")
    if results is not None:
        if len(results) != len(solution):
            raise ValueError(f"task {task.id}: {len(solution)} tool turns but {len(results)} results")
        for i, (step, res) in enumerate(zip(solution, results, strict=True)):
            if step["expect"] not in res:
                raise ValueError(
                    f"task {task.id}: result of turn {i} ({step['tool']} {step['query']!r}) "
                    f"does not contain {step['expect']!r}: {res[:200]!r}"
                )
    turns = [f"<think>{th}</think><{s['tool']}>{s['query']}</{s['tool']}>" for th, s in zip(thinks, solution)]
    turns.append(f"<think>{thinks[-1]}</think><answer>\\boxed{{{task.ground_truth}}}</answer>")
    return turns
