"""The `toy` task source: generated toy tasks, and the search corpus they need.

    env:
      tasks: {source: toy, kinds: [arith, twohop, both], seed: 0}

The source gives the `search` tool its default corpus (the toy knowledge
base, written once under `$AGENTENV_CACHE/toy/`), so a run config names no
corpus.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentenv.errors import ConfigError
from agentenv.tasks.sources import TaskSet
from agentenv.toy.tasks import GENERATOR_VERSION, KINDS, SPLITS, Kind, ToyConfig, build_toy_suite
from agentenv.toy.tiny.config import cache_root


def toy_corpus_path(seed: int = 0) -> Path:
    """The toy knowledge base of `seed` as a JSONL search corpus, written once under the cache.

    The corpus depends only on the knowledge base, not on how many questions
    are asked, so it is written from a suite with none.
    """
    path = cache_root() / "toy" / f"v{GENERATOR_VERSION}-seed{seed}" / "corpus.jsonl"
    if not path.exists():
        no_questions: dict[str, Any] = {f"n_{k}_{s}": 0 for k in KINDS for s in SPLITS}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        build_toy_suite(ToyConfig(seed=seed, **no_questions)).write_corpus(tmp)
        os.replace(tmp, path)  # atomic: concurrent writers produce the same bytes
    return path


@dataclass(frozen=True)
class ToyTasksConfig:
    """Options of the `toy` task source.

    Attributes:
        kinds: Toy task kinds to mix: `arith` (python), `twohop` (two searches),
            `both` (search, then python).
        seed: Seed of the toy task generator (knowledge base, questions).
        n_heldout: Held-out questions of each kind (None: the generator's 100); more only append.
        system_prompt: Replaces the toy system prompt (which describes ARPO's tags), e.g. one that fits
            the `hermes` tool-call format.
    """

    kinds: tuple[Kind, ...] = KINDS
    seed: int = 0
    n_heldout: int | None = None
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ConfigError("env.tasks.kinds", f"unknown toy kinds {bad or '(none given)'}; choose from {', '.join(KINDS)}")
        if self.n_heldout is not None and (not isinstance(self.n_heldout, int) or self.n_heldout < 1):
            raise ConfigError("env.tasks.n_heldout", f"must be a positive number of questions, got {self.n_heldout!r}")

    def tool_defaults(self) -> dict[str, dict[str, Any]]:
        """The `search` tool reads the toy knowledge base unless the config names another corpus."""
        return {"search": {"corpus": str(toy_corpus_path(self.seed))}}


def toy_tasks(cfg: ToyTasksConfig) -> TaskSet:
    """The toy suite of `cfg.seed`, restricted to `cfg.kinds` (train and held-out splits)."""
    sizes: dict[str, Any] = {f"n_{k}_heldout": cfg.n_heldout for k in cfg.kinds} if cfg.n_heldout is not None else {}
    suite = build_toy_suite(ToyConfig(seed=cfg.seed, **sizes))
    kinds = set(cfg.kinds)
    train = [t for t in suite.train if t.metadata["kind"] in kinds]
    heldout = [t for t in suite.heldout if t.metadata["kind"] in kinds]
    if cfg.system_prompt is not None:
        system = {"role": "system", "content": cfg.system_prompt}
        train, heldout = ([replace(t, messages=(system, *t.messages[1:])) for t in ts] for ts in (train, heldout))
    return TaskSet(train, heldout)
