"""`Runtime`'s optional capabilities of its parts, asked by declared Protocol: a tool's health check
(`HealthChecked`), the policy's close (`AsyncCloseable` or `Closeable`), an MCP tool's server (`FromServer`)."""

from __future__ import annotations

import asyncio

import pytest

from agentenv.envs.testing import EchoTool
from agentenv.errors import ToolError
from agentenv.training.build import Runtime, _source


class CheckedTool(EchoTool):
    def __init__(self, name: str, ok: bool):
        super().__init__(name)
        self.ok, self.checked = ok, 0

    async def health_check(self) -> None:
        self.checked += 1
        if not self.ok:
            raise ToolError("index missing\nmore lines")


class SyncPolicy:
    closed = 0

    def close(self) -> None:
        self.closed += 1


class AsyncPolicy:
    closed = 0

    async def aclose(self) -> None:
        self.closed += 1


def runtime(tools: dict, policy: object) -> Runtime:
    return Runtime("m", None, policy, tools, None, None)  # type: ignore[arg-type]  # only tools and policy are used


def test_tools_with_a_check_run_it_and_a_failing_one_stops_the_run_by_name():
    good, plain = CheckedTool("good", ok=True), EchoTool("plain")  # plain: nothing to warm, no check
    asyncio.run(runtime({"good": good, "plain": plain}, SyncPolicy()).health_check(timeout_s=10))
    assert good.checked == 1
    bad = CheckedTool("bad", ok=False)
    with pytest.raises(ToolError, match=r"^the bad tool failed its health check: index missing$"):
        asyncio.run(runtime({"good": good, "bad": bad}, SyncPolicy()).health_check(timeout_s=10))
    assert bad.checked == 1


@pytest.mark.parametrize("policy", [SyncPolicy(), AsyncPolicy(), object()], ids=["close", "aclose", "neither"])
def test_the_policy_is_closed_by_the_hook_it_declares(policy):
    asyncio.run(runtime({"plain": EchoTool("plain")}, policy).aclose())
    assert getattr(policy, "closed", 1) == 1


def test_a_tool_names_its_config_key_and_an_mcp_tool_its_server():
    assert _source("search", EchoTool()) == "env.tools.search"
    served = EchoTool("add")
    served.server = "calc"  # type: ignore[attr-defined]
    assert _source("mcp", served) == "env.tools.mcp.servers.calc"
