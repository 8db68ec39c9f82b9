"""`agentenv/Browser-v0`: the browser as a token-level gymnasium env."""

from __future__ import annotations

import gymnasium

import agentenv.envs  # noqa: F401  registers the envs
from agentenv.envs import ToolEnv
from agentenv.envs.testing import build_test_tokenizer
from agentenv.tools.browser import BrowserTool


def test_registered_lazily():
    spec = gymnasium.registry["agentenv/Browser-v0"]
    assert spec.kwargs["tool"] == "browse"  # a registered tool, built when the env is made


async def test_make_and_step(site):
    tok = build_test_tokenizer()
    env = gymnasium.make(
        "agentenv/Browser-v0", tokenizer=tok, env_config={"max_calls": 2, "max_result_tokens": 4096},
        allow_hosts=["127.0.0.1"], passage_chars=1000,
    )
    base = env.unwrapped
    assert isinstance(base, ToolEnv) and isinstance(base.tool, BrowserTool)
    assert base.tool.name == "browse" and base.tool.config.passage_chars == 1000
    base.reset(seed=0)
    query = tok.encode(f"{site.url('/article')} | how tall is the tower", add_special_tokens=False)
    obs, reward, terminated, truncated, info = await base.astep(query)
    text = tok.decode(obs)
    assert text.startswith("<result>\nTitle: Eiffel Tower") and "330 metres" in text and text.endswith("</result>")
    assert info["ok"] and reward == 0.0 and not terminated and not truncated
    obs, _, _, truncated, info = await base.astep(tok.encode("ftp://nope", add_special_tokens=False))
    assert not info["ok"] and "only http and https" in info["error"] and truncated
    await base.aclose()
    await base.tool.aclose()
