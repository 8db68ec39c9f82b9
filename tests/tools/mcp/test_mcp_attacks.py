"""MCP servers that misbehave without dying: an error whose words sound like a dead connection, children left
behind, boolean, huge and deep schemas, two servers listing one tool name (issue 37, G7, G8, G10).

The server is the SDK's low-level `Server` (schema_server.py), over stdio, started by the tests."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agentenv._reaper import _start_time, child_pids
from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.tools.mcp.client import make_mcp_tools
from agentenv.tools.mcp.config import MCPConfig

SERVER = str(Path(__file__).resolve().parent / "schema_server.py")


def server(*args: str, **opts) -> dict:
    return {"command": sys.executable, "args": [SERVER, *args], "startup_timeout_s": 120, **opts}


def tools_of(servers: dict, **opts) -> list:
    return make_mcp_tools(build_dataclass(MCPConfig, {"servers": servers, **opts}, "env.tools.mcp"))


async def close_all(tools: list) -> None:
    for t in tools:
        await t.aclose()


def _running(pid: int) -> bool:
    return _start_time(pid) is not None  # alive and no zombie


def _gone(pids, timeout_s: float = 15.0) -> bool:
    end = time.monotonic() + timeout_s
    while any(_running(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return not any(_running(p) for p in pids)


@pytest.fixture(scope="module")
def odd():
    tools = tools_of({"odd": server("odd")})
    yield {t.name: t for t in tools}
    asyncio.run(close_all(tools))


async def test_an_error_that_says_connection_closed_restarts_nothing(odd):
    proc = odd["upstream"]._process
    before, generation = proc.restarts, proc.generation
    waiting = asyncio.ensure_future(odd["wait"]("x"))  # another episode's call, in flight on the shared server
    await asyncio.sleep(0.3)
    failed = await odd["upstream"]("x")
    assert not failed.ok and failed.error == "mcp_error" and "connection closed" in failed.text
    done = await waiting
    assert done.ok and done.text.startswith("wait"), done  # not `server_died`
    assert proc.restarts == before and proc.generation == generation


async def test_a_live_server_slow_to_answer_the_ping_after_a_failed_call_is_not_restarted(odd, monkeypatch):
    """A ping unanswered for a while is no transport evidence: the server answered the failed call a moment ago
    and is busy (a blocking tool, another episode's work; here it is stopped with SIGSTOP for 1.5 s). Restarting
    it killed the calls other episodes had in flight on it and a stateful server's state; a hung server is still
    caught by the call's own limit (`call_timeout_s`)."""
    from agentenv._reaper import tagged_pids
    from agentenv.tools.mcp import client

    monkeypatch.setattr(client, "_PING_TIMEOUT_S", 0.5)
    proc = odd["upstream"]._process
    (pid,) = [p for p in tagged_pids(proc.uid, client.SERVER_VAR) if p in child_pids()][:1]
    session, ping = proc.session, proc.session.send_ping

    async def busy_ping():  # the server is alive and busy when the ping comes
        os.kill(pid, signal.SIGSTOP)
        asyncio.get_running_loop().call_later(1.5, os.kill, pid, signal.SIGCONT)
        return await ping()

    monkeypatch.setattr(session, "send_ping", busy_ping)
    before, generation = proc.restarts, proc.generation
    failed = await odd["upstream"]("x")
    assert not failed.ok and failed.error == "mcp_error", failed
    await asyncio.sleep(1.5)
    after = await odd["echo"]("still here")
    assert after.ok and "still here" in after.text, after
    assert proc.restarts == before and proc.generation == generation


async def test_a_boolean_sub_schema_takes_any_value(odd):
    r = await odd["echo"]("hello")  # {"text": true}: any value; the call's text is its value
    assert r.ok and r.text == "echo: 'hello'"
    r = await odd["echo"]('{"text": {"a": [1, 2]}}')
    assert r.ok and r.text == "echo: {'a': [1, 2]}"


async def test_children_of_a_server_that_stops_are_reaped():
    tools = tools_of({"odd": server("odd")})
    by = {t.name: t for t in tools}
    try:
        r = await by["spawn"]("x")  # the server starts a child in a session of its own, then exits cleanly
        child = int(r.text)
        assert _running(child)
    finally:
        await close_all(tools)
    survived = not await asyncio.to_thread(_gone, [child])
    if survived:
        os.kill(child, signal.SIGKILL)
    assert not survived


def test_a_name_collision_names_both_servers_and_stops_what_started():
    before = child_pids()
    with pytest.raises(ConfigError) as e:
        tools_of({"first": server("odd"), "second": server("odd", "other_echo")})
    assert e.value.key == "env.tools.mcp.servers.second"
    assert "'upstream'" in str(e.value) and "env.tools.mcp.servers.first" in str(e.value)
    left = child_pids() - before
    assert _gone(left), f"still running after the error: {left}"


@pytest.mark.parametrize("depth, why", [
    (40, "nested 83 deep"),  # the client parses it; agentenv refuses it
    (100, "nested too deep for its parser"),  # the SDK drops it: the listing fails after the parse error
    (400, "depth exceeded"),  # the server cannot even send it
])  # fmt: skip
def test_a_deep_schema_is_refused_by_name_not_as_a_timeout(depth, why):
    before = child_pids()
    with pytest.raises(ConfigError) as e:
        tools_of({"deep": server("deep", str(depth), startup_timeout_s=30)})
    assert e.value.key == "env.tools.mcp.servers.deep" and "TimeoutError" not in str(e.value)
    assert why in str(e.value), e.value
    assert _gone(child_pids() - before)


@pytest.mark.slow
def test_a_200kb_schema_fails_the_build_not_every_reset(tmp_path, tiny_model_path):
    from agentenv.configs import config_from_dict
    from agentenv.training.build import build_runtime

    cfg = config_from_dict({
        "model": {"path": str(tiny_model_path)}, "policy": {"backend": "hf"},
        "env": {"tools": {"mcp": {"servers": {"big": server("huge")}}}, "tool_format": "hermes",
                "chat_template": "chatml_hermes", "max_context_tokens": 2048, "max_result_tokens": 128,
                "tasks": {"source": "toy", "kinds": ["arith"], "seed": 0}},
        "trainer": {"output_dir": str(tmp_path)},
    })  # fmt: skip
    before = child_pids()
    with pytest.raises(ConfigError) as e:
        build_runtime(cfg)
    msg = str(e.value)
    assert e.value.key == "env.max_context_tokens" and "'huge'" in msg and "schemas" in msg, msg
    assert _gone(child_pids() - before)  # the server started for the check is stopped
