"""SearchToolConfig validation and the make_search_tool factory."""

from __future__ import annotations

import json

import pytest

from agentenv.errors import ConfigError, ToolError
from agentenv.tools.search import LocalSearchTool, SearchToolConfig, make_search_tool


@pytest.mark.parametrize(
    "kwargs, key, shown",
    [
        ({"provider": "local"}, "search.corpus", "None"),
        ({"provider": "bing", "k": 0}, "search.k", "0"),
        ({"provider": "bing", "k": 80}, "search.k", "80"),
        ({"provider": "bing", "max_chars": -5}, "search.max_chars", "-5"),
        ({"provider": "bing", "rate": 0}, "search.rate", "0"),
        ({"provider": "bing", "timeout_s": 0}, "search.timeout_s", "0"),
        ({"provider": "bing", "max_retries": -1}, "search.max_retries", "-1"),
        ({"provider": "bing", "endpoint": "api.bing.com"}, "search.endpoint", "'api.bing.com'"),
        ({"provider": "local", "corpus": "c.jsonl", "bm25_b": 2.0}, "search.bm25_b", "2.0"),
    ],
)
def test_bad_values_name_key_and_value(kwargs, key, shown):
    with pytest.raises(ConfigError) as ei:
        SearchToolConfig(**kwargs)
    assert ei.value.key == key and shown in str(ei.value)


@pytest.mark.parametrize(
    "kwargs, key, shown",
    [({"provider": "google"}, "search.provider", "'google'"), ({"on_error": "ignore"}, "search.on_error", "'ignore'")],
)
def test_a_choice_outside_its_literal_is_refused_where_options_are_read(kwargs, key, shown):
    with pytest.raises(ConfigError) as ei:
        make_search_tool(**kwargs)  # the loader checks Literal choices (the config class does not again)
    assert ei.value.key == key and shown in str(ei.value) and "must be one of" in str(ei.value)


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'max_chars'") as ei:
        make_search_tool(provider="bing", max_char=10)
    assert ei.value.key == "search.max_char"


async def test_local_tool_from_config_and_from_options(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": str(i), "title": f"T{i}", "text": f"word{i} " * 5}) for i in range(20)))
    tool = make_search_tool(SearchToolConfig(corpus=str(corpus), k=3, max_chars=7))
    assert isinstance(tool, LocalSearchTool) and tool.k == 3
    res = await tool("word4")
    assert res.text == "Page 1: T4\nword4 w"
    tool2 = make_search_tool(corpus=str(corpus), k=2)  # the gymnasium.make path
    assert tool2.k == 2 and (await tool2("word5")).metadata["ids"] == ["5"]
    with pytest.raises(ConfigError, match="search.kk"):
        make_search_tool(corpus=str(corpus), kk=2)


def test_missing_corpus_and_missing_key_are_tool_errors(tmp_path, monkeypatch):
    with pytest.raises(ToolError, match="nope.jsonl"):
        make_search_tool(SearchToolConfig(corpus=str(tmp_path / "nope.jsonl")))
    for var in ("AGENTENV_BING_KEY", "BING_SEARCH_V7_SUBSCRIPTION_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ToolError, match="AGENTENV_BING_KEY"):
        make_search_tool(SearchToolConfig(provider="bing"))


def test_local_search_needs_a_corpus():
    # The tool has no default corpus of its own: a task source gives one (the toy source: tests/toy/test_source.py).
    with pytest.raises(ConfigError, match=r"search\.corpus: provider 'local' needs a JSONL corpus path"):
        make_search_tool()
