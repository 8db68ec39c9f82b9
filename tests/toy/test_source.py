"""The toy world as a task source and a model, registered like a user's parts."""

from __future__ import annotations

import pytest

from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.tasks.sources import TASK_SOURCES, TasksConfig
from agentenv.toy.source import ToyTasksConfig, toy_corpus_path
from agentenv.toy.tasks import ToyConfig, build_toy_suite


def test_toy_source_gives_tasks_and_the_search_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path))
    cfg = build_dataclass(TasksConfig, {"source": "toy", "kinds": ["twohop"], "seed": 0, "eval_limit": 5}, "env.tasks")
    assert "toy" in TASK_SOURCES.registered()  # registered by agentenv.toy, as a user's package registers
    corpus = cfg.tool_defaults()["search"]["corpus"]
    assert corpus == str(tmp_path / "toy" / "v1-seed0" / "corpus.jsonl")
    out = cfg.load()
    assert {t.metadata["kind"] for t in out.train} == {"twohop"} and len(out.heldout) == 5
    # the corpus is the knowledge base's, whatever questions a suite asks
    suite = build_toy_suite(ToyConfig(seed=0))
    lines = open(corpus).read().splitlines()
    assert len(lines) == len(suite.corpus_records()) and toy_corpus_path(0) == tmp_path / "toy" / "v1-seed0" / "corpus.jsonl"
    with pytest.raises(ConfigError, match=r"env\.tasks\.kinds\[0\]: must be one of 'arith', 'twohop', 'both', got 'math'"):
        build_dataclass(TasksConfig, {"source": "toy", "kinds": ["math"]}, "env.tasks")
    with pytest.raises(ConfigError, match=r"env\.tasks\.kinds: unknown toy kinds"):
        ToyTasksConfig(kinds=())


def test_tiny_is_a_registered_model(tiny_model_path):
    from agentenv.policies.models import MODELS, resolve_model_path

    assert "tiny" in MODELS.registered()
    assert resolve_model_path("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"  # a hub id passes through
    assert resolve_model_path("agentenv.toy.model:TINY") == resolve_model_path("tiny") == str(tiny_model_path)


def test_more_heldout_questions_and_another_system_prompt():
    from agentenv.toy.source import toy_tasks

    base = toy_tasks(ToyTasksConfig(kinds=("arith",)))
    more = toy_tasks(ToyTasksConfig(kinds=("arith",), n_heldout=300, system_prompt="Use python."))
    assert len(base.heldout) == 100 and len(more.heldout) == 300
    assert [t.question for t in more.heldout[:100]] == [t.question for t in base.heldout]  # more only appends
    assert [t.question for t in more.train] == [t.question for t in base.train]
    assert all(t.messages[0] == {"role": "system", "content": "Use python."} for t in [*more.train, *more.heldout])
