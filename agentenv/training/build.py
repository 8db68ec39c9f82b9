"""Wiring: a RunConfig -> model path, tokenizer, policy, tools, tasks, env factory.

Every part is looked up by name in its registry (`agentenv.registry`); what is
heavy is imported here, inside functions, when a config asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from agentenv.configs import RunConfig
from agentenv.envs.config import AgentEnvConfig
from agentenv.policies.backends import build_policy
from agentenv.policies.models import resolve_model_path
from agentenv.tasks.sources import TaskSet


def build_tools(cfg: AgentEnvConfig) -> dict[str, Any]:
    """Prototype tools by the name the config gives them (episodes fork them)."""
    return {name: part.make(config) for name, (part, config) in cfg.tool_parts().items()}


def make_env_factory(cfg: AgentEnvConfig, tools: dict[str, Any], tokenizer: Any) -> Callable[[], Any]:
    """A zero-argument callable returning a fresh AgentEnv over the prototype tools."""
    from agentenv.envs import AgentEnv

    reward_fn = cfg.reward_fn()
    prototypes = list(tools.values())

    def make_env() -> Any:
        return AgentEnv(prototypes, tokenizer, reward_fn=reward_fn, config=cfg)

    return make_env


@dataclass
class Runtime:
    """Everything a run needs besides the trainable model."""

    model_path: str
    tokenizer: Any
    policy: Any
    tools: dict[str, Any]
    tasks: TaskSet
    make_env: Callable[[], Any]
    extras: dict[str, Any] = field(default_factory=dict)

    async def aclose(self) -> None:
        for tool in self.tools.values():
            await tool.aclose()
        close = getattr(self.policy, "aclose", None) or getattr(self.policy, "close", None)
        if close is not None:
            res = close()
            if hasattr(res, "__await__"):
                await res


def build_runtime(cfg: RunConfig, model_path: str | None = None) -> Runtime:
    """Tokenizer, tasks, tools and the rollout policy of a run (`model_path`: the resolved `model.path`)."""
    from transformers import AutoTokenizer

    path = model_path or resolve_model_path(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = cfg.env.tasks.load()
    tools = build_tools(cfg.env)
    policy = build_policy(cfg.policy.backend, cfg.backend_config, path)
    return Runtime(path, tokenizer, policy, tools, tasks, make_env_factory(cfg.env, tools, tokenizer))
