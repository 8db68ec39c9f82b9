"""ToolEnv: one tool as a gymnasium env over tokens."""

import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

from agentenv.envs.testing import CounterTool, EchoTool, SleepTool, build_test_tokenizer
from agentenv.envs.tool_env import ToolEnv, ToolEnvConfig
from agentenv.errors import ConfigError


def test_query_in_result_out(tok, enc):
    env = ToolEnv(EchoTool("search"), tok)
    obs, info = env.reset(seed=0)
    assert len(obs) == 0 and info == {"tool": "search"}
    obs, r, term, trunc, info = env.step(enc("capital of Norvex"))
    assert tok.decode(obs) == "<result>\necho: capital of Norvex\n</result>"
    assert (r, term, trunc) == (0.0, False, False) and info["ok"] and info["calls"] == 1
    env.close()


def test_same_truncation_as_agent_env(tok, enc):
    env = ToolEnv(EchoTool("search", repeat=100), tok, ToolEnvConfig(max_result_tokens=30))
    env.reset()
    obs, *_, info = env.step(enc("x"))
    assert len(obs) == 30 and info["result_truncated"] and tok.decode(obs).endswith("...[truncated]\n</result>")


def test_max_calls_truncates(tok, enc):
    env = ToolEnv(EchoTool("search"), tok, {"max_calls": 2})
    env.reset()
    assert env.step(enc("a"))[3] is False
    assert env.step(enc("b"))[3] is True
    with pytest.raises(ResetNeeded, match="max_calls=2"):
        env.step(enc("c"))


def test_timeout_and_order(tok, enc):
    env = ToolEnv(SleepTool("sleep", 5.0), tok, ToolEnvConfig(tool_timeout_s=0.05))
    with pytest.raises(ResetNeeded, match="before reset"):
        env.step(enc("x"))
    env.reset()
    obs, *_, info = env.step(enc("x"))
    assert "timed out" in tok.decode(obs) and info["ok"] is False and info["error"] == "timeout"


async def test_astep(tok, enc):
    env = ToolEnv(EchoTool("search"), tok)
    env.reset()
    obs, *_ = await env.astep(enc("q"))
    assert tok.decode(obs) == "<result>\necho: q\n</result>"


def test_fork_independent_and_lifecycle(tok, enc):
    proto = CounterTool("python")
    env = ToolEnv(proto, tok)
    env.reset()
    env.step(enc("a"))
    child = env.fork()
    assert tok.decode(child.step(enc("b"))[0]) == "<result>\ncount=2\n</result>"
    assert env.calls == 1 and child.calls == 2
    assert tok.decode(env.step(enc("c"))[0]) == "<result>\ncount=2\n</result>"
    child.close()
    env.close()
    assert all(t.closed for t in proto.forks) and not proto.closed
    owned = ToolEnv(proto, tok, owns_tool=True)
    owned.close()
    owned.close()
    assert proto.closed


def test_check_env(tok):
    env = ToolEnv(EchoTool("search"), tok)
    check_env(env, skip_render_check=True)


def test_config_validation():
    with pytest.raises(ConfigError, match="tool_env.max_calls"):
        ToolEnvConfig(max_calls=0)
    with pytest.raises(ConfigError, match="tool_env.bogus"):
        ToolEnv(EchoTool("search"), build_test_tokenizer(), config={"bogus": 1})
