"""Entry points of the registered envs (imported only when `gymnasium.make` asks).

Each factory fills in the defaults a user of `gymnasium.make` would expect: the
tiny model's tokenizer and the toy tasks. They load lazily, here, so that
`import agentenv` stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentenv.envs.agent_env import AgentEnv, AgentEnvConfig, RewardFn
from agentenv.envs.tool_env import ToolEnv, ToolEnvConfig
from agentenv.errors import ConfigError
from agentenv.tasks.task import Task
from agentenv.tools.base import Tool


def _default_tokenizer() -> Any:
    from agentenv.policies.tiny import load_tiny_tokenizer

    return load_tiny_tokenizer()


def resolve(ref: str | Callable[..., Any], key: str) -> Callable[..., Any]:
    """A callable from itself or from a `"module.path:attr"` string."""
    if callable(ref):
        return ref
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(key, f"expected a callable or 'module.path:attr', got {ref!r}")
    module, _, attr = ref.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(key, f"cannot load {ref!r}: {e}") from e
    if not callable(obj):
        raise ConfigError(key, f"{ref!r} is not callable")
    return obj


def make_agent_env(
    tools: Sequence[Tool] = (),
    tokenizer: Any = None,
    reward_fn: RewardFn | None = None,
    config: AgentEnvConfig | Mapping[str, Any] | None = None,
    tasks: Sequence[Task] | None = None,
    *,
    owns_tools: bool = False,
) -> AgentEnv:
    """`agentenv/Agent-v0`: an AgentEnv over the given tools.

    Args:
        tools: Prototype tools (default: none; the episode can only answer).
        tokenizer: Default: the tiny model's tokenizer.
        reward_fn: Default: ARPO's hierarchical reward.
        config: `AgentEnvConfig` or a mapping of its fields.
        tasks: Tasks drawn at `reset` without a task; default: the toy train tasks.
        owns_tools: Close the tools when the env is closed.
    """
    if tokenizer is None:
        tokenizer = _default_tokenizer()
    if tasks is None:
        from agentenv.tasks.toy import load_toy_tasks

        tasks = load_toy_tasks(split="train")
    return AgentEnv(list(tools), tokenizer, reward_fn=reward_fn, config=config, tasks=tasks, owns_tools=owns_tools)


def make_tool_env(
    tool_factory: str | Callable[..., Tool],
    tokenizer: Any = None,
    env_config: ToolEnvConfig | Mapping[str, Any] | None = None,
    **tool_kwargs: Any,
) -> ToolEnv:
    """A ToolEnv over a tool built by `tool_factory(**tool_kwargs)`; the env owns (closes) the tool.

    Args:
        tool_factory: A callable returning a Tool, or `"module.path:attr"` naming one.
        tokenizer: Default: the tiny model's tokenizer.
        env_config: `ToolEnvConfig` or a mapping of its fields (named so that a
            tool factory may take its own `config`).
        **tool_kwargs: Passed to the factory.
    """
    tool = resolve(tool_factory, "tool_env.tool_factory")(**tool_kwargs)
    if tokenizer is None:
        tokenizer = _default_tokenizer()
    return ToolEnv(tool, tokenizer, config=env_config, owns_tool=True)
