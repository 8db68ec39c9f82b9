"""`AgentEnvConfig`: the agent environment's one config, and the run config's `env` section.

    env:
      class: agent              # the env class: AgentEnv (default), a registered name or 'module:attr'
      options: {}               # the env class's own options (checked by its config_cls)
      tools:                    # tool name -> its options (a bare list of names works too)
        search: {k: 3}          # checked by the tool's own config class
        python: {mode: stateless, timeout_s: 5}
      tasks: {source: toy, kinds: [arith, twohop, both]}
      reward: arpo              # a registered reward or 'package.module:attr'
      max_tool_calls: 3
      max_context_tokens: 512
      tool_format: hermes       # or tags (ARPO's, the default)
      chat_template: chatml_hermes   # None: the tokenizer's own

Budgets are checked when the config is made; the parts it names (tools,
tasks, reward) are looked up in their registries, and a run config checks
them when it loads (`validate_parts`), so a typo fails before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from agentenv.envs.results import DEFAULT_RESULT_TEMPLATE, DEFAULT_TRUNCATION_MARKER, validate_result_fields
from agentenv.errors import ConfigError
from agentenv.loader import check_number, keyed
from agentenv.tasks.rewards import RewardFn, get_reward
from agentenv.tasks.sources import TasksConfig
from agentenv.tools.registry import ToolPart, get_tool

if TYPE_CHECKING:
    from agentenv.envs.parts import EnvSpec


@dataclass(frozen=True)
class AgentEnvConfig:
    """An `AgentEnv` episode: the parts it is made of, its limits, how results are shown.

    Attributes:
        env_class: (`class` in a config) The env class every episode is an
            instance of: `agent` (`AgentEnv`), `verifiers`, `openenv`, a name
            registered with `agentenv.envs.parts.register_env_class`, or
            `module:attr` (see `agentenv.envs.parts`).
        options: The env class's own options, checked by its `config_cls`
            (AgentEnv has none: its settings are the fields below).
        tools: Tool name (registered, or `module:attr`) -> its options, checked by
            the tool's config class; a list of names takes every tool's defaults.
            Defaults the task source offers (the toy corpus) fill in options
            the config leaves out. Read by a run (`gymnasium.make("agentenv/Agent-v0")`
            and `AgentEnv` take tools directly).
        tasks: The task source and its options (`agentenv.tasks.sources.TasksConfig`).
        reward: The reward function: `arpo`, `f1`, `exact`, `math`, a registered
            name or `module:attr` (see `agentenv.tasks.rewards`).
        max_tool_calls: Most tool calls per episode (ARPO paper: 5 for
            reasoning tasks, 6 for deep search). A call beyond it is not run: the
            model reads that the limit is reached and should answer; a second
            call beyond it ends the episode (`finish_reason="tool_limit"`).
        max_context_tokens: Budget of the whole context (prompt, turns,
            results). When it is full the episode is truncated
            (`finish_reason="context"`). The default fits the tiny model (2,048 positions).
        max_result_tokens: Most tokens of one formatted tool result; longer
            results are cut and marked.
        tool_timeout_s: Wall-clock limit of one tool call; a timeout becomes a
            result the model reads. Above the tools' own limits (a sandboxed
            run, a web search with its retries, a page fetch and its summary).
        result_template: How a result is shown; holds `{text}` once.
        truncation_marker: Appended to a result text that was cut.
        tool_format: How calls and results are written: `tags` (ARPO's: tags
            inside one assistant turn), `hermes` (JSON calls in `<tool_call>`,
            results as `tool` turns of the chat template), a registered format or
            `module:attr` (see `agentenv.envs.formats`).
        chat_template: The chat template prompts and turns are rendered with:
            None (the tokenizer's own), a template shipped with agentenv
            (`chatml_hermes`: ChatML with hermes-style tools), or a Jinja file.
        chat_template_kwargs: Extra variables for every rendering (e.g. Qwen3's
            `enable_thinking: false`).
        reward_timeout_s: Time limit of scoring one episode. A verifier that
            runs its check in the verifier worker (`math`, `reasoning_gym`) is
            killed at it; an answer whose check was cut off, or whose verifier
            raised, scores the reward's minimum (see `agentenv.tasks.rewards`).
    """

    env_class: str = keyed("class", "agent")
    options: Mapping[str, Any] = field(default_factory=dict)
    tools: Mapping[str, Any] | tuple[str, ...] = ("search", "python")
    tasks: TasksConfig = field(default_factory=TasksConfig)
    reward: str = "arpo"
    max_tool_calls: int = 5
    max_context_tokens: int = 2048
    max_result_tokens: int = 256
    tool_timeout_s: float = 60.0
    result_template: str = DEFAULT_RESULT_TEMPLATE
    truncation_marker: str = DEFAULT_TRUNCATION_MARKER
    tool_format: str = "tags"
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    reward_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        tools = self.tools
        if isinstance(tools, str) or not isinstance(tools, (Mapping, list, tuple)):
            raise ConfigError("env.tools", f"expected a mapping of tool name -> options or a list of names, got {tools!r}")
        if not isinstance(tools, Mapping):
            if len(set(tools)) != len(tools):
                raise ConfigError("env.tools", f"a tool is named twice in {list(tools)}")
            tools = {name: {} for name in tools}
        for name, options in tools.items():
            if options is not None and not isinstance(options, Mapping):
                raise ConfigError(f"env.tools.{name}", f"expected a mapping of the tool's options, got {options!r}")
        object.__setattr__(self, "tools", {str(k): dict(v or {}) for k, v in tools.items()})
        check_number("env.max_tool_calls", self.max_tool_calls, low_ok=True, integer=True)
        check_number("env.max_context_tokens", self.max_context_tokens, low=2, low_ok=True, integer=True)
        check_number("env.reward_timeout_s", self.reward_timeout_s)
        validate_result_fields(
            "env", self.result_template, self.truncation_marker, self.max_result_tokens, self.tool_timeout_s
        )
        if not isinstance(self.chat_template_kwargs, Mapping):
            raise ConfigError("env.chat_template_kwargs", f"expected a mapping, got {self.chat_template_kwargs!r}")
        object.__setattr__(self, "chat_template_kwargs", dict(self.chat_template_kwargs))
        if not isinstance(self.options, Mapping):
            raise ConfigError("env.options", f"expected a mapping of the env class's options, got {self.options!r}")
        object.__setattr__(self, "options", dict(self.options))
        if self.max_result_tokens >= self.max_context_tokens:
            raise ConfigError(
                "env.max_result_tokens",
                f"{self.max_result_tokens} must be below env.max_context_tokens {self.max_context_tokens}",
            )

    def tool_parts(self) -> dict[str, tuple[ToolPart, Any]]:
        """Each tool's part and validated config, by the name the config gives (looked up once).

        Raises:
            ConfigError: An unknown tool (with the closest names), a plugin that
                fails to import, or a bad option (named `env.tools.<tool>.<key>`).
        """
        done = self.__dict__.get("_tool_parts")
        if done is None:
            defaults = self.tasks.tool_defaults()
            done = {}
            for name, options in cast(Mapping[str, Any], self.tools).items():  # __post_init__ made it a dict
                part = get_tool(name)
                key = f"env.tools.{name}"
                done[name] = (part, part.config(options, key, defaults=defaults.get(name)))
            object.__setattr__(self, "_tool_parts", done)
        return done

    def env_spec(self) -> EnvSpec:
        """`class` resolved with its validated `options` (looked up once).

        Raises:
            ConfigError: An unknown class (with the closest names), one that does not
                import, one that is no env class (naming what it lacks), or a bad option.
        """
        done = self.__dict__.get("_env_spec")
        if done is None:
            from agentenv.envs.parts import resolve_env

            done = resolve_env(self.env_class, self.options)
            object.__setattr__(self, "_env_spec", done)
        return cast("EnvSpec", done)

    def reward_fn(self) -> RewardFn:
        """The reward function `reward` names."""
        return get_reward(self.reward)

    def validate_parts(self) -> None:
        """Look up the tools, the reward, the tool-call format and the chat template now, so a typo fails at load time."""
        from agentenv.envs.chat import load_chat_template
        from agentenv.envs.formats import TOOL_FORMATS

        self.env_spec()
        self.tool_parts()
        self.reward_fn()
        TOOL_FORMATS.get(self.tool_format)
        load_chat_template(self.chat_template)

