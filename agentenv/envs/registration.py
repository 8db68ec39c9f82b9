"""Register agentenv's envs with gymnasium as `agentenv/<Name>-v0`.

Entry points are `"module:callable"` strings, so registering imports nothing
heavy: `gymnasium.make` imports the module when an env is made. A wrong id gets
gymnasium's suggestion of the closest registered name ("Did you mean ...").

Every tool in the tool registry gets a `ToolEnv` (`agentenv/Search-v0` for
`search`); a tool registered later adds its own with
`register_tool_env("Calc", "calc")` (a tool name, `module:attr` or a factory).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium

NAMESPACE = "agentenv"


def env_id(name: str, version: int = 0) -> str:
    """`agentenv/<name>-v<version>`."""
    return f"{NAMESPACE}/{name}-v{version}"


def register_env(
    name: str,
    entry_point: str | Callable[..., Any],
    version: int = 0,
    kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Register `agentenv/<name>-v<version>` (again is a no-op); returns the id.

    Args:
        name: CamelCase env name, e.g. `Agent`.
        entry_point: `"module:callable"` (imported lazily) or a callable.
        version: The `-vN` suffix.
        kwargs: Default keyword arguments of the entry point (`gymnasium.make` overrides them).
    """
    eid = env_id(name, version)
    if eid not in gymnasium.registry:
        gymnasium.register(id=eid, entry_point=entry_point, kwargs=dict(kwargs) if kwargs else None)
    return eid


def register_tool_env(
    name: str,
    tool: str | Callable[..., Any],
    version: int = 0,
    tool_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Register a `ToolEnv` over the tool `tool` names, built with `tool_kwargs` as its options.

    `gymnasium.make(id, tokenizer=..., env_config=..., **more_options)` makes it;
    the env owns (closes) the tool.

    Args:
        name: Env name, e.g. `Search` gives `agentenv/Search-v0`.
        tool: A registered tool name, `"module.path:attr"` (kept lazy) or a factory returning a Tool.
        version: The `-vN` suffix.
        tool_kwargs: Default options of the tool.

    Returns:
        The env id.
    """
    return register_env(name, "agentenv.envs.factories:make_tool_env", version, {"tool": tool, **(tool_kwargs or {})})


def register_builtin_envs() -> None:
    """Register `agentenv/Agent-v0` and a ToolEnv for each tool registered so far. Imports nothing beyond gymnasium."""
    from agentenv.tools.registry import TOOLS, tool_env_name

    register_env("Agent", "agentenv.envs.factories:make_agent_env")
    for tool in TOOLS.registered():
        register_tool_env(tool_env_name(tool), tool)
