"""The tools a config can name (`env.tools`), each a factory and the config class of its options.

    from agentenv.tools.registry import register_tool
    register_tool("calc", "my_pkg.calc:Calculator", "my_pkg.calc:CalcConfig")

or in a config, with no registration, `env.tools: {"my_pkg.calc:Calculator": {precision: 3}}`;
an installed package adds tools through the `agentenv.tools` entry-point group.
`factory(config)` returns a prototype `Tool` (episodes fork it); a factory
without a config class takes its options as keyword arguments. The tool's
`name` is the tag the model writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentenv.registry import Part, Registry, as_part
from agentenv.tools.base import Tool

ToolPart = Part[Tool | Sequence[Tool]]
"""A tool's part: its factory makes one prototype `Tool`, or several (an MCP server's tools)."""

TOOLS: Registry[ToolPart] = Registry("tool", "env.tools", group="agentenv.tools", adapt=as_part)
_ENV_NAMES: dict[str, str] = {}


def register_tool(
    name: str, factory: Any, config_cls: Any = None, *, env_name: str | None = None, overwrite: bool = False
) -> None:
    """Register a tool under `name`.

    Args:
        name: What configs call it (`env.tools: {name: {...}}`).
        factory: `factory(config) -> Tool`, or a `"module:attr"` string naming it.
        config_cls: The dataclass of its options (or a `"module:attr"` string); None:
            the factory takes its options as keyword arguments.
        env_name: Name of its gymnasium ToolEnv (`agentenv/<env_name>-v0`); default `name` capitalized.
    """
    TOOLS.register(name, Part(factory, config_cls), overwrite=overwrite)
    if env_name is not None:
        _ENV_NAMES[name] = env_name


def tool_env_name(name: str) -> str:
    """The gymnasium env name of tool `name` (`search` -> `Search`)."""
    return _ENV_NAMES.get(name, name.capitalize())


def get_tool(name: str, key: str | None = None) -> ToolPart:
    """The tool part called `name` (registered, an entry point, or `module:attr`)."""
    return TOOLS.get(name, key)


# The built-in tools, registered as a user's are. Only strings: nothing is imported until a config asks.
register_tool("search", "agentenv.tools.search.config:make_search_tool", "agentenv.tools.search.config:SearchToolConfig")
register_tool("python", "agentenv.tools.python_sandbox.tool:make_python_tool",
              "agentenv.tools.python_sandbox.config:PythonSandboxConfig")  # fmt: skip
register_tool("browse", "agentenv.tools.browser:make_browser_tool", "agentenv.tools.browser.config:BrowserConfig",
              env_name="Browser")  # fmt: skip
register_tool("mcp", "agentenv.tools.mcp.client:make_mcp_tools", "agentenv.tools.mcp.config:MCPConfig")  # one entry, many tools
