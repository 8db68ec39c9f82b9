"""`agentenv/Search-v0`: the search tool as a token-level gymnasium env."""

from __future__ import annotations

import gymnasium
from gymnasium.utils.env_checker import check_env

import agentenv.envs  # noqa: F401  registers the envs
from agentenv.envs import ToolEnv
from agentenv.envs.testing import build_test_tokenizer
from agentenv.tools.search import LocalSearchTool


def test_registered_lazily():
    spec = gymnasium.registry["agentenv/Search-v0"]
    assert spec.kwargs["tool"] == "search"  # a registered tool, built when the env is made


def test_make_and_step_on_the_toy_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path))
    tok = build_test_tokenizer()
    env = gymnasium.make("agentenv/Search-v0", tokenizer=tok, env_config={"max_result_tokens": 4096}, k=3)
    base = env.unwrapped
    assert isinstance(base, ToolEnv) and isinstance(base.tool, LocalSearchTool) and base.tool.k == 3
    base.reset(seed=0)
    # A fact of the toy world, asked with its reference query.
    rec = next(r for r in base.tool.retriever.corpus.passages if " founded by " in r.text or "founder" in r.text)
    obs, reward, terminated, truncated, info = base.step(tok.encode(f"founder of {rec.title}", add_special_tokens=False))
    text = tok.decode(obs)
    assert text.startswith("<result>\nPage 1: ") and text.endswith("</result>")
    assert rec.text in text and text.count("Page ") == 3
    assert info["ok"] and reward == 0.0 and not terminated
    obs, *_, info = base.step(tok.encode("   ", add_special_tokens=False))
    assert not info["ok"] and "Empty search query" in info["error"]
    check_env(base, skip_render_check=True)
    env.close()
