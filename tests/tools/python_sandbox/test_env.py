"""`agentenv/Python-v0`: the python sandbox as a token-level gymnasium env."""

from __future__ import annotations

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentenv.envs  # noqa: F401  registers the envs
from agentenv.envs import ToolEnv
from agentenv.envs.testing import build_test_tokenizer
from agentenv.tools.python_sandbox import PythonTool


def test_registered_lazily():
    spec = gymnasium.registry["agentenv/Python-v0"]
    assert spec.kwargs["tool"] == "python"  # a registered tool, built when the env is made


def test_unknown_option_is_a_config_error():
    with pytest.raises(agentenv.ConfigError, match="timout_s.*did you mean 'timeout_s'"):
        gymnasium.make("agentenv/Python-v0", tokenizer=build_test_tokenizer(), timout_s=3)


@pytest.mark.docker
def test_make_and_step_in_session_mode(sandbox_image):
    tok = build_test_tokenizer()
    env = gymnasium.make("agentenv/Python-v0", tokenizer=tok, mode="session", pool_size=1, timeout_s=3)
    base = env.unwrapped
    try:
        assert isinstance(base, ToolEnv) and isinstance(base.tool, PythonTool) and base.tool.mode == "session"
        base.reset(seed=0)
        obs, reward, terminated, truncated, info = base.step(
            tok.encode("x = 6\nprint(x * 7)", add_special_tokens=False)
        )
        assert tok.decode(obs) == "<result>\n42\n</result>" and info["ok"] and reward == 0.0
        twin = base.fork()
        base.step(tok.encode("x = 0", add_special_tokens=False))
        obs, *_ = twin.step(tok.encode("x", add_special_tokens=False))
        assert tok.decode(obs) == "<result>\n6\n</result>"  # the fork kept the state at fork time
        obs, *_, info = base.step(tok.encode("1/0", add_special_tokens=False))
        assert not info["ok"] and "ZeroDivisionError" in tok.decode(obs)
        twin.close()
        base.reset(seed=1)  # a new episode: a fresh session
        obs, *_ = base.step(tok.encode("'x' in globals()", add_special_tokens=False))
        assert tok.decode(obs) == "<result>\nFalse\n</result>"
        check_env(base, skip_render_check=True)
    finally:
        env.close()
