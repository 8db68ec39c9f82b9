"""Wiring: a RunConfig -> model path, tokenizer, policy, tools, tasks, env factory.

Every part is looked up by name in its registry (`agentenv.registry`); what is
heavy is imported here, inside functions, when a config asks for it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv.configs import RunConfig
from agentenv.envs.config import AgentEnvConfig
from agentenv.envs.episode import MakeEnv
from agentenv.errors import ConfigError, ToolError
from agentenv.policies.backends import build_policy
from agentenv.policies.base import Policy
from agentenv.policies.models import resolve_model_path
from agentenv.rollout.config import RayRolloutConfig
from agentenv.tasks.sources import TaskSet
from agentenv.tools.base import FromServer, HealthChecked, Tool, tool_schema
from agentenv.types import AsyncCloseable, Closeable, Tokenizer

_CLOSE_TIMEOUT_S = 120.0
"""Bound on closing one prototype tool (a sandbox pool removes its containers)."""
_HEALTH_TIMEOUT_S = 300.0
"""Bound on one tool's health check (a sandbox pool may start and warm its containers)."""


def first_line(e: BaseException) -> str:
    """An exception's first line (library errors can run to pages), or its type."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_output_dir(path: str | Path) -> None:
    """Make `trainer.output_dir` and prove it writable, before minutes of model loading.

    Raises:
        ConfigError: It is a file, or cannot be created or written.
    """
    out = Path(path)
    probe = out / f".write-test-{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except FileExistsError:
        raise ConfigError("trainer.output_dir", f"{str(out)!r} is a file, not a folder") from None
    except OSError as e:
        raise ConfigError("trainer.output_dir", f"{str(out)!r} is not writable ({e.strerror or e})") from None


def check_prompts_fit(tasks: TaskSet, tokenizer: Tokenizer, max_context_tokens: int, make_env: MakeEnv | None = None,
                      tools: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Every prompt must leave the policy room in `env.max_context_tokens`.

    Otherwise every such episode fails at its reset, and a run whose prompts
    are all too long would "finish" having learned nothing. With `make_env`,
    the longest task's prompt is rendered as `reset` renders it, the tools'
    schemas included (an MCP server may list a 200 KB one).

    Raises:
        ConfigError: (`env.max_context_tokens`) with the longest prompt's task and size (and the tools' share).
    """
    from agentenv.envs.agent_env import AgentEnv
    from agentenv.tasks.prompts import render_prompt

    longest, worst = 0, None
    for task in [*tasks.train, *tasks.heldout]:
        n = len(render_prompt(tokenizer, task.messages))
        if n > longest:
            longest, worst = n, task
    if worst is None:
        return
    plain, why = longest, ""
    env = make_env() if make_env is not None else None
    if isinstance(env, AgentEnv):  # the run's env (make_env_factory's) renders as its reset will
        longest = len(env.prompt_ids(worst))
        if longest > plain and tools:
            biggest = max(tools.values(), key=lambda t: len(json.dumps(tool_schema(t))))
            why = (f" ({longest - plain} of them the tools' schemas; the largest, {biggest.name!r}, is "
                   f"{len(json.dumps(tool_schema(biggest))):,} characters: drop it from its env.tools entry)")  # fmt: skip
    if longest >= max_context_tokens:
        raise ConfigError(
            "env.max_context_tokens",
            f"{max_context_tokens} leaves no room for the policy: task {worst.id!r} has a {longest}-token prompt"
            f"{why}; raise env.max_context_tokens above {longest} plus room for the answer (policy.max_turn_tokens)",
        )


def close_tools_now(tools: list[Any]) -> None:
    """Close prototype tools from synchronous code (a build that fails after starting them): nothing is left running."""
    import asyncio
    import threading

    from agentenv.envs.results import close_tool

    async def close_all() -> None:
        for tool in tools:
            try:
                await close_tool(tool, _CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - closing after a failure: the others go anyway
                pass

    closer = threading.Thread(target=asyncio.run, args=(close_all(),), name="agentenv-close-tools")
    closer.start()
    closer.join()


def build_tools(cfg: AgentEnvConfig, ray: RayRolloutConfig | None = None) -> dict[str, Any]:
    """Prototype tools by `tool.name`, the tag the model calls them by (episodes fork them); a factory that makes
    several (`mcp`) gives a list. With `ray` (`rollout.placement: ray`), the tools it names are served by Ray
    actors placed by their resources (`agentenv.distributed.tools`).

    Raises:
        ConfigError: Two tools have one name (two MCP servers' tools, or an MCP tool named like a built-in one):
            the model could reach only one of them.
    """
    out: dict[str, Any] = {}
    source: dict[str, str] = {}
    started: list[Any] = []
    try:
        for name, (part, config) in cfg.tool_parts().items():
            if ray is not None and name in ray.tools:
                from agentenv.distributed.cluster import start_tool

                made = start_tool(ray, name, functools.partial(part.make, config))
            else:
                made = part.make(config)
            these: list[Any] = list(made) if isinstance(made, (list, tuple)) else [made]
            started += these
            for tool in these:
                if tool.name in out:
                    raise ConfigError(
                        f"env.tools.{name}",
                        f"{_source(name, tool)} makes a tool named {tool.name!r}, and so does "
                        f"{source[tool.name]}: tool names must be unique (the model calls a tool by its name); "
                        "drop one, or expose only some of an MCP server's tools (its `tools` list)",
                    )
                out[tool.name] = tool
                source[tool.name] = _source(name, tool)
    except BaseException:
        close_tools_now(started)  # the tools (MCP servers, sandboxes) already started
        raise
    return out


def _source(part: str, tool: Any) -> str:
    """Where a tool comes from, as a config key (an MCP tool: its server's)."""
    return f"env.tools.{part}.servers.{tool.server}" if isinstance(tool, FromServer) else f"env.tools.{part}"


def make_env_factory(cfg: AgentEnvConfig, tools: dict[str, Tool], tokenizer: Tokenizer) -> MakeEnv:
    """A zero-argument callable returning a fresh episode env of `env.class` over the prototype tools."""
    from agentenv.envs.parts import env_factory

    return env_factory(cfg.env_spec(), cfg, list(tools.values()), tokenizer, cfg.reward_fn())


@dataclass
class Runtime:
    """Everything a run needs besides the trainable model."""

    model_path: str
    tokenizer: Tokenizer
    policy: Policy
    tools: dict[str, Tool]
    tasks: TaskSet
    make_env: MakeEnv
    agent: Any = None  # `rollout.agent`'s AgentRunner (agentenv.rollout.endpoint.agent), None without one

    def agent_sampler(self, n: int) -> Any:
        """The sampler of `n` episodes per task through `agent` (`rollout.agent`, a client env), or None without one:
        then episodes run over `make_env` (`training.evaluate.sample_group` takes either)."""
        return self.agent.sampler(n) if self.agent is not None else None

    async def health_check(self, timeout_s: float = _HEALTH_TIMEOUT_S) -> None:
        """Every tool that has a `health_check()` runs it, on the tool loop where its calls run.

        A sandbox pool starts and warms every container and runs `print(1)` in
        each; a retriever answers a query. So a tool that is cold or broken
        stops the run here with one line, instead of failing the calls of the
        first evaluation (and its accuracy) in silence.

        Raises:
            ToolError: A tool failed its check or did not finish it within `timeout_s`.
        """
        from agentenv.envs.toolloop import run_on_tool_loop

        for name, tool in self.tools.items():
            if not isinstance(tool, HealthChecked):  # a tool with nothing to warm has no check
                continue
            try:
                await run_on_tool_loop(tool.health_check, timeout_s, f"the {name} tool")
            except TimeoutError:
                raise ToolError(f"the {name} tool did not pass its health check within {timeout_s:g} s") from None
            except ToolError as e:
                raise ToolError(f"the {name} tool failed its health check: {first_line(e)}") from None

    async def aclose(self) -> None:
        from agentenv.envs.results import close_tool

        for tool in self.tools.values():
            await close_tool(tool, _CLOSE_TIMEOUT_S)
        if self.agent is not None:
            await self.agent.aclose()
        if isinstance(self.policy, AsyncCloseable):
            await self.policy.aclose()
        elif isinstance(self.policy, Closeable):
            self.policy.close()


def build_runtime(cfg: RunConfig, model_path: str | None = None) -> Runtime:
    """Tokenizer, tasks, tools and the rollout policy of a run (`model_path`: the resolved `model.path`)."""
    from transformers import AutoTokenizer

    path = model_path or resolve_model_path(cfg.model.path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:  # no such hub id, no tokenizer files, offline
        raise ConfigError("model.path", f"cannot load a tokenizer from {path!r}: {first_line(e)}") from None
    spec = cfg.env.env_spec()
    client_env = spec.client_env() if spec.drives_client else None
    tasks = client_env.tasks() if client_env is not None else cfg.env.tasks.load()
    check_prompts_fit(tasks, tokenizer, cfg.env.max_context_tokens)  # before the policy's minutes of start-up
    if cfg.rollout.placement == "ray":
        return _build_ray_runtime(cfg, path, tokenizer, tasks)
    tools = build_tools(cfg.env)
    make_env = _no_episode_env(spec.name) if client_env is not None else make_env_factory(cfg.env, tools, tokenizer)
    if client_env is None:
        try:  # now with the tools' schemas in the prompt, as every reset will render it
            check_prompts_fit(tasks, tokenizer, cfg.env.max_context_tokens, make_env, tools)
        except ConfigError:
            close_tools_now(list(tools.values()))
            raise
    policy = build_policy(cfg.policy.backend, cfg.backend_config, path)
    rt = Runtime(path, tokenizer, policy, tools, tasks, make_env)
    if cfg.rollout.agent is not None or client_env is not None:
        rt.agent = build_agent_runner(cfg, tokenizer, client_env)
    return rt


def _no_episode_env(name: str) -> MakeEnv:
    def make_env() -> Any:
        raise ConfigError("env.class", f"{name!r} runs against the endpoint (rt.agent); it has no episode env")

    return make_env


def build_agent_runner(cfg: RunConfig, tokenizer: Tokenizer, client_env: Any = None) -> Any:
    """The runner of `rollout.agent`, or of a client env (`env.class: verifiers`): the endpoint over the policy,
    rendering with the env's chat template."""
    from agentenv.envs.chat import ChatTemplate
    from agentenv.rollout.endpoint.agent import AgentRunner

    chat = ChatTemplate.from_config(tokenizer, cfg.env.chat_template, cfg.env.chat_template_kwargs)
    agent: Any = cfg.rollout.agent
    if client_env is not None:
        agent = functools.partial(client_env.run, model=cfg.rollout.endpoint.model_name)
    return AgentRunner(agent, chat, cfg.env.reward_fn(), cfg.rollout, cfg.env.max_context_tokens,
                       cfg.env.reward_timeout_s)  # fmt: skip


def ray_policy_factory(cfg: RunConfig, model_path: str) -> Any:
    """A picklable `() -> Policy` that builds the run's backend inside a rollout worker.

    Under `rollout.ray.tensor_parallel_size > 1` the vllm backend runs its
    tensor-parallel workers through vLLM's Ray executor, in the worker's
    placement group.
    """
    config = cfg.backend_config
    tp = cfg.rollout.ray.tensor_parallel_size
    if tp > 1 and cfg.policy.backend == "vllm":
        kwargs = {**config.engine_kwargs, "distributed_executor_backend": "ray"}
        config = dataclasses.replace(config, tensor_parallel_size=tp, engine_kwargs=kwargs)
    return functools.partial(build_policy, cfg.policy.backend, config, model_path)


def _build_ray_runtime(cfg: RunConfig, path: str, tokenizer: Tokenizer, tasks: TaskSet) -> Runtime:
    """`rollout.placement: ray`: join the cluster, start (or find) the workers and the tools named in `rollout.ray.tools`."""
    rc = cfg.rollout.ray
    try:
        from agentenv.distributed import cluster
    except ImportError as e:
        raise ConfigError("rollout.placement", f"ray needs Ray: pip install 'agentenv[ray]' ({first_line(e)})") from None
    cluster.connect(rc)
    tools = build_tools(cfg.env, rc)
    policy = cluster.start_policy(rc, ray_policy_factory(cfg, path), tokenizer)
    return Runtime(path, tokenizer, policy, tools, tasks, make_env_factory(cfg.env, tools, tokenizer))
