"""Registry: agentenv/<Name>-v0 via lazy entry points; wrong ids suggest the closest name."""

import subprocess
import sys

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentenv  # noqa: F401  registers the envs
from agentenv.envs import AgentEnv, ToolEnv, register_tool_env
from agentenv.envs.testing import EchoTool, boxed_reward, make_task


def test_import_agentenv_registers_without_heavy_modules():
    code = (
        "import sys, agentenv, gymnasium; "
        "assert 'agentenv/Agent-v0' in gymnasium.registry; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm', 'docker')]; "
        "lazy = [m for m in sys.modules if m in ('agentenv.envs.agent_env', 'agentenv.envs.factories')]; "
        "print(heavy, lazy); assert not heavy and not lazy"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr + out.stdout
    assert gymnasium.registry["agentenv/Agent-v0"].entry_point == "agentenv.envs.factories:make_agent_env"


def test_wrong_id_suggests_the_closest_name():
    with pytest.raises(gymnasium.error.NameNotFound, match="Did you mean: `Agent`"):
        gymnasium.make("agentenv/Agnet-v0")
    with pytest.raises(gymnasium.error.NamespaceNotFound, match="Did you mean: `agentenv`"):
        gymnasium.make("agentnev/Agent-v0")


def test_make_agent_env_passes_check_env(tok):
    tasks = [make_task(), make_task(task_id="t1", answer="1")]
    env = gymnasium.make("agentenv/Agent-v0", tools=[EchoTool("search")], tokenizer=tok, tasks=tasks,
                         reward_fn=boxed_reward, config={"max_tool_calls": 3})  # fmt: skip
    assert isinstance(env.unwrapped, AgentEnv) and env.unwrapped.config.max_tool_calls == 3
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_register_tool_env_lazy_string(tok, enc):
    eid = register_tool_env("TestEcho", "agentenv.envs.testing:EchoTool", tool_kwargs={"name": "search", "repeat": 2})
    assert eid == "agentenv/TestEcho-v0" and eid in gymnasium.registry
    assert register_tool_env("TestEcho", "agentenv.envs.testing:EchoTool") == eid  # again: no-op
    env = gymnasium.make(eid, tokenizer=tok, env_config={"max_calls": 3})
    base = env.unwrapped
    assert isinstance(base, ToolEnv) and base.tool.name == "search"
    env.reset(seed=0)
    obs, *_ = env.step(enc("hi"))
    assert tok.decode(obs) == "<result>\necho: hi echo: hi\n</result>"
    check_env(base, skip_render_check=True)
    env.close()


def test_bad_tool_factory_is_a_config_error(tok):
    register_tool_env("TestBroken", "agentenv.envs.testing:NoSuchTool")
    said = "tool_env.tool: tool 'agentenv.envs.testing:NoSuchTool' failed to import: AttributeError"
    with pytest.raises(agentenv.ConfigError, match=said):
        gymnasium.make("agentenv/TestBroken-v0", tokenizer=tok)


def test_agent_env_defaults_tiny_tokenizer_and_toy_tasks():
    env = gymnasium.make("agentenv/Agent-v0")
    base = env.unwrapped
    assert len(base.tasks) > 100 and base.tasks[0].id.startswith("toy-")
    assert len(base.tokenizer) == base.action_space.vocab_size
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("toy-") and list(obs) == base.context
    check_env(base, skip_render_check=True)
    env.close()
