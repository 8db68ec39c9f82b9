"""Gymnasium layer: ToolEnv wraps one Tool; AgentEnv runs one episode of one task.

Importing this package registers the envs (`agentenv/<Name>-v0`) and nothing
heavier than gymnasium; the classes load on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentenv.envs.registration import env_id, register_builtin_envs, register_env, register_tool_env

register_builtin_envs()

_LAZY = {
    "AgentEnv": "agentenv.envs.agent_env",
    "AgentEnvConfig": "agentenv.envs.config",
    "EpisodeEnv": "agentenv.envs.episode",
    "ToolEnv": "agentenv.envs.tool_env",
    "ToolEnvConfig": "agentenv.envs.tool_env",
    "TokenSequence": "agentenv.envs.spaces",
    "ParsedTurn": "agentenv.envs.parsing",
    "parse_turn": "agentenv.envs.parsing",
    "ResultFormatter": "agentenv.envs.results",
    "check_agent_env": "agentenv.envs.checker",
    "EnvInputs": "agentenv.envs.parts",
    "EnvSpec": "agentenv.envs.parts",
    "register_env_class": "agentenv.envs.parts",
    "TextEnv": "agentenv.envs.text_env",
    "Reply": "agentenv.envs.text_env",
}

__all__ = ["env_id", "register_builtin_envs", "register_env", "register_tool_env", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentenv.envs' has no attribute {name!r}")
