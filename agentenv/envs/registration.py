"""Register agentenv's envs with gymnasium as `agentenv/<Name>-v0`.

Entry points are `"module:callable"` strings, so registering imports nothing
heavy: `gymnasium.make` imports the module when an env is made. A wrong id gets
gymnasium's suggestion of the closest registered name ("Did you mean ...").

Tool developers add their env with one line in `register_builtin_envs`, e.g.
`register_tool_env("Search", "agentenv.tools.search:make_search_tool")`.
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
    tool_factory: str | Callable[..., Any],
    version: int = 0,
    tool_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Register a `ToolEnv` over the tool that `tool_factory(**tool_kwargs)` builds.

    `gymnasium.make(id, tokenizer=..., env_config=..., **more_tool_kwargs)` makes it;
    the env owns (closes) the tool.

    Args:
        name: Env name, e.g. `Search` gives `agentenv/Search-v0`.
        tool_factory: `"module.path:callable"` (kept lazy) or a callable returning a Tool.
        version: The `-vN` suffix.
        tool_kwargs: Default keyword arguments of the factory.

    Returns:
        The env id.
    """
    return register_env(
        name, "agentenv.envs.factories:make_tool_env", version, {"tool_factory": tool_factory, **(tool_kwargs or {})}
    )


def register_builtin_envs() -> None:
    """Register every env agentenv ships. Imports nothing beyond gymnasium."""
    register_env("Agent", "agentenv.envs.factories:make_agent_env")
    register_tool_env("Browser", "agentenv.tools.browser:make_browser_tool")
    register_tool_env("Search", "agentenv.tools.search:make_search_tool")
    register_tool_env("Python", "agentenv.tools.python_sandbox:make_python_tool")
