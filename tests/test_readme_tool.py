"""The README's new tool is real: its code block runs as written, registers the tool, and the
tool built from a config answers a call (and turns the agent's mistake into a result)."""

from __future__ import annotations

import asyncio
import re
import sys
import types
from pathlib import Path

import pytest

from agentenv.errors import ConfigError
from agentenv.tools.base import Tool
from agentenv.tools.registry import TOOLS, get_tool

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_tool_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    tools = [b for b in blocks if "register_tool(" in b]
    assert len(tools) == 1, f"expected one python block that registers a tool in the README, found {len(tools)}"
    return tools[0]


@pytest.fixture
def readme_tool():
    module = types.ModuleType("readme_calc")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    TOOLS._entries.pop("calc", None)
    try:
        exec(compile(readme_tool_source(), str(README), "exec"), module.__dict__)
        yield module
    finally:
        TOOLS._entries.pop("calc", None)
        TOOLS._loaded.pop("calc", None)
        sys.modules.pop(module.__name__, None)


def test_the_readme_tool_runs_from_a_config(readme_tool):
    part = get_tool("calc", "env.tools.calc")
    tool = part.make(part.config({"digits": 2}, "env.tools.calc"))
    assert isinstance(tool, Tool) and tool.name == "calc"
    assert asyncio.run(tool("6*7")).text == "42"
    assert asyncio.run(tool("1/3")).text == "0.33"
    bad = asyncio.run(tool("__import__('os')"))
    assert not bad.ok and bad.error.startswith("cannot evaluate")
    assert tool.fork() is tool
    asyncio.run(tool.aclose())
    with pytest.raises(ConfigError, match="digts"):
        part.config({"digts": 2}, "env.tools.calc")
