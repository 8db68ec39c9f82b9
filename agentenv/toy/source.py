"""The `toy` task source: generated toy tasks, and the search corpus they need.

    env:
      tasks: {source: toy, kinds: [arith, twohop, both], seed: 0}

The source gives the `search` tool its default corpus (the toy knowledge
base, written once under `$AGENTENV_CACHE/toy/`), so a run config names no
corpus.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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
    """

    kinds: tuple[Kind, ...] = KINDS
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ConfigError("env.tasks.kinds", f"unknown toy kinds {bad or '(none given)'}; choose from {', '.join(KINDS)}")

    def tool_defaults(self) -> dict[str, dict[str, Any]]:
        """The `search` tool reads the toy knowledge base unless the config names another corpus."""
        return {"search": {"corpus": str(toy_corpus_path(self.seed))}}


def toy_tasks(cfg: ToyTasksConfig) -> TaskSet:
    """The toy suite of `cfg.seed`, restricted to `cfg.kinds` (train and held-out splits)."""
    suite = build_toy_suite(ToyConfig(seed=cfg.seed))
    kinds = set(cfg.kinds)
    return TaskSet(
        [t for t in suite.train if t.metadata["kind"] in kinds],
        [t for t in suite.heldout if t.metadata["kind"] in kinds],
    )
