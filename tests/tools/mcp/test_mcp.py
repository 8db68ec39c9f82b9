"""MCP servers as tools: a server written in the test with the SDK's `MCPServer`, and the real
`mcp-server-time` package (offline: it reads the tz database), both over stdio."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from agentenv.configs import config_from_dict, load_config
from agentenv.envs import AgentEnv
from agentenv.errors import ConfigError, ToolError
from agentenv.loader import build_dataclass
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import run_episode
from agentenv.tasks.rewards import get_reward
from agentenv.tools.mcp.client import make_mcp_tools
from agentenv.tools.mcp.config import MCPConfig
from agentenv.types import SamplingParams

SERVER = str(Path(__file__).resolve().parent / "calc_server.py")
CALC = {"command": sys.executable, "args": [SERVER]}
TIME = {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]}


def tools_of(servers: dict, **opts) -> list:
    return make_mcp_tools(build_dataclass(MCPConfig, {"servers": servers, **opts}, "env.tools.mcp"))


async def close_all(tools: list) -> None:
    for t in tools:
        await t.aclose()


@pytest.fixture(scope="module")
def both():
    assert shutil.which("mcp-server-time"), "pip install agentenv[dev] installs mcp-server-time"
    tools = tools_of({"calc": CALC, "time": TIME})
    yield {t.name: t for t in tools}
    asyncio.run(close_all(tools))


def test_each_servers_tools_are_listed_under_their_names_with_schemas(both):
    assert set(both) == {"add", "divide", "crash", "wait", "remember", "recall", "get_current_time", "convert_time"}
    add = both["add"]
    assert add.description == "Add two integers." and add.server == "calc"
    assert add.schema["properties"]["a"]["type"] == "integer" and add.schema["required"] == ["a", "b"]
    assert both["get_current_time"].schema["required"] == ["timezone"]
    from agentenv.tools.base import tool_schema

    assert tool_schema(add)["function"]["parameters"] == add.schema  # what the hermes format shows the model
    from agentenv.tools.base import FromServer
    from agentenv.training.build import _source

    assert isinstance(add, FromServer) and _source("mcp", add) == "env.tools.mcp.servers.calc"  # where errors point


async def test_calls_and_every_mistake_is_a_result(both):
    assert (await both["add"]('{"a": 2, "b": 3}')).text == "5"
    now = await both["get_current_time"]("UTC")  # one parameter: the call's text is its value
    assert now.ok and json.loads(now.text)["timezone"] == "UTC"
    bad_tz = await both["get_current_time"]("Mars/Olympus")
    assert not bad_tz.ok and "Mars/Olympus" in bad_tz.text
    for query, why in [("two and three", "bad_arguments"), ('{"a": 2}', "bad_arguments"), ('{"a": 1, "b": 0}', "tool_error")]:
        r = await (both["divide"] if why == "tool_error" else both["add"])(query)
        assert not r.ok and r.error == why and r.text.startswith("Error:"), r


def hermes_call(name: str, **args) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def env_over(tools: list, tokenizer) -> AgentEnv:
    cfg = {"tool_format": "hermes", "chat_template": "chatml_hermes", "max_context_tokens": 4096,
           "max_result_tokens": 512, "tool_timeout_s": 30, "tools": {}}  # fmt: skip
    return AgentEnv(tools, tokenizer, reward_fn=get_reward("exact"), config=cfg)


async def test_a_server_that_crashes_mid_episode_gives_an_error_result_and_is_restarted(tok):
    from agentenv.envs.testing import make_task

    tools = tools_of({"calc": CALC})
    turns = [hermes_call("add", a=1, b=1), hermes_call("crash", reason="now"), hermes_call("add", a=4, b=3),
             "<answer>7</answer>"]  # fmt: skip
    try:
        traj = await run_episode(ScriptedPolicy(tok, turns), env_over(tools, tok), make_task("4 + 3?", "7"),
                                 SamplingParams(max_tokens=400), seed=0)  # fmt: skip
        results = [tok.decode(s.token_ids) for s in traj.segments if s.source == "tool"]
    finally:
        await close_all(tools)
    assert not traj.failed, traj.error
    assert "2" in results[0]
    assert "failed during the crash call" in results[1] and "restarted" in results[1]
    assert "7" in results[2] and traj.finish_reason == "answer" and traj.reward == 1.0
    assert traj.tool_calls == {"add": 2, "crash": 1}


async def test_stateful_servers_get_a_process_per_episode_and_refuse_forks(tok):
    tools = tools_of({"notes": {**CALC, "stateful": True, "tools": ["remember", "recall"]}})
    try:
        protos = {t.name: t for t in tools}

        async def episode(note: str) -> tuple[str, dict]:
            mine = {n: p.fork() for n, p in protos.items()}  # as AgentEnv.reset forks them
            await mine["remember"](note)
            return (await mine["recall"]("")).text, mine

        (a, ep_a), (b, ep_b) = await asyncio.gather(episode("alpha"), episode("beta"))
        assert a.endswith(": alpha") and b.endswith(": beta")  # each episode's tools share its own process
        assert a.split(":")[0] != b.split(":")[0]  # two processes
        with pytest.raises(ToolError, match="cannot fork mid-episode"):
            ep_a["recall"].fork()
        await close_all([*ep_a.values(), *ep_b.values()])
    finally:
        await close_all(tools)
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, ["algorithm.name=arpo", "env.tools={}", "policy.backend=hf"] +
                         [f"env.tools.mcp.servers.notes.{k}={json.dumps(v)}" for k, v in {**CALC, "stateful": True}.items()])  # fmt: skip
    assert e.value.key == "env.tools.mcp.servers.notes.stateful" and "stateful" in str(e.value)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, ["env.tools={}", "env.tools.mcp.servers.x.url=ftp://nope"])
    assert e.value.key == "env.tools.mcp.servers.x.url"
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, ["env.tools={}", "env.tools.mcp.servers.x.args=[a]"])
    assert e.value.key == "env.tools.mcp.servers.x.command"


YAML = """
model: {{path: tiny}}
policy: {{backend: hf, max_turn_tokens: 32, temperature: 1.0}}
env:
  tools:
    mcp:
      servers:
{servers}
      call_timeout_s: 20
  tasks: {{source: toy, kinds: [arith], seed: 0}}
  reward: arpo
  tool_format: hermes
  chat_template: chatml_hermes
  max_tool_calls: 2
  max_context_tokens: 1536
  max_result_tokens: 160
algorithm: {{name: grpo, group_size: 2}}
trainer: {{steps: 2, tasks_per_step: 2, mini_batch_tasks: 2, micro_batch_size: 8, lr: 0.001, eval_tasks: 0,
          checkpoint_every: 2, output_dir: {out}}}
logging: {{tensorboard: false, progress: false}}
"""


@pytest.mark.parametrize("servers", [
    {"calc": {**CALC, "tools": ["add", "divide"]}},  # written with the SDK's server class, here (two of its tools)
    {"time": TIME},  # the mcp-server-time package
], ids=["sdk-server", "mcp-server-time"])  # fmt: skip
def test_trains_two_steps_from_yaml(servers, tmp_path, tiny_model_path):
    from agentenv.training.metrics import read_metrics
    from agentenv.training.trainer import Trainer

    block = textwrap.indent(json.dumps(servers), " " * 8)
    path = tmp_path / "mcp.yaml"
    path.write_text(YAML.format(servers=block, out=tmp_path / "run"))
    cfg = load_config(path)
    trainer = Trainer(cfg)
    names = set(trainer.rt.tools)
    prompt = trainer.rt.tokenizer.decode(trainer.rt.make_env().reset(options={"task": trainer.rt.tasks.train[0]})[0])
    result = trainer.train()
    steps = [r for r in read_metrics(result.output_dir / "metrics.jsonl") if "rollout/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/failed"] == 0 for r in steps)
    listed = {"calc": {"add", "divide"}, "time": {"get_current_time", "convert_time"}}
    assert names == set().union(*(listed[s] for s in servers))
    for name in names:  # the schemas are in the prompt, in the hermes tool-call format's system turn
        assert f'"name": "{name}"' in prompt


async def test_a_server_by_url_over_streamable_http():
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tools = []
    try:
        for _ in range(100):  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        tools = await asyncio.to_thread(tools_of, {"calc": {"url": f"http://127.0.0.1:{port}/mcp", "startup_timeout_s": 5}})
        by = {t.name: t for t in tools}
        assert (await by["add"]('{"a": 40, "b": 2}')).text == "42"
        proc.terminate()
        proc.wait(10)
        gone = await by["add"]('{"a": 1, "b": 1}')  # the server is gone: a result the model reads, not a crash
        assert not gone.ok and gone.text.startswith("Error:")
    finally:
        proc.kill()
        await close_all(tools)


async def test_calls_in_flight_when_a_server_dies_restart_it_once():
    tools = tools_of({"calc": CALC})
    by = {t.name: t for t in tools}
    try:
        proc = tools[0]._process
        before = proc.restarts
        results = await asyncio.gather(by["crash"]("now"), *(by["wait"]("2") for _ in range(4)))
        assert not any(r.ok for r in results), results  # every call in flight on the dead server: an error result
        after = await by["add"]('{"a": 20, "b": 22}')
    finally:
        await close_all(tools)
    assert after.text == "42"
    assert proc.restarts - before == 1  # one restart for every call that found it dead
