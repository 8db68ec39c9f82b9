"""Entry points of the registered envs (imported only when `gymnasium.make` asks).

Each factory fills in the defaults a user of `gymnasium.make` would expect:
the default model's tokenizer, and the default env config's task source (its
tasks, and the options it gives tools, such as the search corpus). They load
lazily, here, so that `import agentenv` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentenv.envs.agent_env import AgentEnv, RewardFn
from agentenv.envs.config import AgentEnvConfig
from agentenv.envs.tool_env import ToolEnv, ToolEnvConfig
from agentenv.errors import ConfigError
from agentenv.registry import as_part
from agentenv.tasks.task import Task
from agentenv.tools.base import Tool
from agentenv.tools.registry import get_tool
from agentenv.types import Tokenizer


def _default_tokenizer() -> Any:
    from agentenv.policies.models import DEFAULT_MODEL, load_tokenizer

    return load_tokenizer(DEFAULT_MODEL)


def make_agent_env(
    tools: Sequence[Tool] = (),
    tokenizer: Tokenizer | None = None,
    reward_fn: RewardFn | None = None,
    config: AgentEnvConfig | Mapping[str, Any] | None = None,
    tasks: Sequence[Task] | None = None,
    *,
    owns_tools: bool = False,
) -> AgentEnv:
    """`agentenv/Agent-v0`: an AgentEnv over the given tools.

    Args:
        tools: Prototype tools (default: none; the episode can only answer).
        tokenizer: Default: the default model's tokenizer (the tiny model's).
        reward_fn: Default: the config's reward (ARPO's hierarchical reward).
        config: `AgentEnvConfig` or a mapping of its fields; its `class` must be `agent` (or an AgentEnv subclass).
        tasks: Tasks drawn at `reset` without a task; default: the training
            tasks of the config's task source (the toy tasks).
        owns_tools: Close the tools when the env is closed.
    """
    from agentenv.loader import build_dataclass

    cfg = build_dataclass(AgentEnvConfig, config, "env")
    cls = cfg.env_spec().cls
    if not issubclass(cls, AgentEnv):  # its options, tasks and tools would be ignored, the env not played
        raise ConfigError("env.class", f"agentenv/Agent-v0 builds an AgentEnv, and env.class is {cfg.env_class!r}; "
                          "build another env class with agentenv.envs.parts.env_factory")  # fmt: skip
    if tokenizer is None:
        tokenizer = _default_tokenizer()
    if tasks is None:
        tasks = cfg.tasks.load().train
    if reward_fn is None:
        reward_fn = cfg.reward_fn()
    return cls(list(tools), tokenizer, reward_fn=reward_fn, config=cfg, tasks=tasks, owns_tools=owns_tools)


def make_tool(tool: str | Callable[..., Tool], options: Mapping[str, Any] | None = None, key: str = "tool_env.tool") -> Tool:
    """A prototype tool from a registered name, `module:attr` or a factory, its options checked.

    Where the options leave them out, the default task source's tool options fill in
    (the toy corpus for `search`).
    """
    if isinstance(tool, str):
        part = get_tool(tool, key)
        defaults = AgentEnvConfig(tools={}).tasks.tool_defaults().get(tool)
    elif callable(tool):
        part, defaults = as_part(tool, key), None
    else:
        raise ConfigError(key, f"expected a tool name, 'module:attr' or a factory, got {tool!r}")
    made = part.make(part.config(options, key, defaults=defaults))
    if not isinstance(made, Tool):  # an MCP server's part makes several
        raise ConfigError(key, f"{tool!r} makes {len(made)} tools; a ToolEnv wraps one")
    return made


def make_tool_env(
    tool: str | Callable[..., Tool],
    tokenizer: Tokenizer | None = None,
    env_config: ToolEnvConfig | Mapping[str, Any] | None = None,
    **tool_options: Any,
) -> ToolEnv:
    """A ToolEnv over a tool built from `tool` and its options; the env owns (closes) the tool.

    Args:
        tool: A registered tool name (`search`), `"module.path:attr"`, or a factory.
        tokenizer: Default: the default model's tokenizer.
        env_config: `ToolEnvConfig` or a mapping of its fields (named so that a
            tool may take its own `config`).
        **tool_options: The tool's options (its config class's fields, or the factory's keywords).
    """
    built = make_tool(tool, tool_options)
    if tokenizer is None:
        tokenizer = _default_tokenizer()
    return ToolEnv(built, tokenizer, config=env_config, owns_tool=True)
