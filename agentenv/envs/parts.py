"""The env as a part: `env.class` names it, and one factory builds every episode's env.

    env:
      class: agent                      # the default: AgentEnv (tools, tool-call format, reward)
      class: my_pkg.games:GuessEnv      # or a registered name, or 'package.module:attr'
      options: {max_guesses: 6}         # the env class's own options, checked by its `config_cls`

An env class is one of two kinds:

- an **episode env** (`EnvClass`): a class whose instances satisfy `EpisodeEnv`
  (the rollout engine steps it token by token), with a classmethod
  `from_inputs(EnvInputs)` and a class attribute `can_fork` (whether `fork()`
  copies an episode mid-way, which tree samplers such as ARPO need);
- a **client env** (`ClientEnv`): an environment that runs its own protocol
  against an OpenAI-compatible client (a verifiers environment). The run
  serves it agentenv's endpoint, which records every token, as it does for a
  user's agent (`rollout.agent`); it brings its own tasks. It cannot fork.

`check_env_class` says in one error what a class that is neither lacks.
Every place that builds an env (training, SFT, evaluation, the tiny model's
traces) goes through `env_factory` / `build_env`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from agentenv.envs.episode import EpisodeEnv, MakeEnv
from agentenv.errors import ConfigError
from agentenv.registry import HasConfigClass, Registry
from agentenv.tasks.rewards import RewardFn
from agentenv.tasks.sources import TaskSet
from agentenv.tasks.task import Task
from agentenv.tools.base import Tool
from agentenv.types import Tokenizer

if TYPE_CHECKING:
    from agentenv.envs.config import AgentEnvConfig


@dataclass(frozen=True)
class EnvInputs:
    """What every episode env is built from.

    Attributes:
        config: The run's `env` section (`AgentEnvConfig`): budgets, chat template, ...
        options: The env class's own options (`env.options`), an instance of its
            `config_cls`, or a dict when it has none.
        tools: Prototype tools (an episode forks them).
        tokenizer: The policy's tokenizer.
        reward_fn: `env.reward`'s function (an env with its own reward may ignore it).
    """

    config: AgentEnvConfig
    options: Any
    tools: Sequence[Tool]
    tokenizer: Tokenizer
    reward_fn: RewardFn


@runtime_checkable
class EnvClass(Protocol):
    """An episode env's class, as `env.class` names it."""

    can_fork: ClassVar[bool]

    @classmethod
    def from_inputs(cls, inputs: EnvInputs) -> EpisodeEnv: ...


@runtime_checkable
class ClientEnv(Protocol):
    """An environment that drives an OpenAI-compatible client itself (served by agentenv's endpoint).

    `tasks()` gives the run's tasks (its dataset); `run(client, task, model)` plays one
    episode (`model`: the name the endpoint serves) and returns the answer text (scored by `env.reward`), a float
    reward, or a `agentenv.tasks.rewards.Scored` (a reward with its parts).
    """

    can_fork: ClassVar[bool]

    @classmethod
    def from_options(cls, options: Any) -> ClientEnv: ...

    def tasks(self) -> TaskSet: ...

    async def run(self, client: Any, task: Task, model: str) -> Any: ...


_EPISODE_MEMBERS = ("context", "remaining_tokens", "stop_strings", "done", "reset", "areset", "astep", "fork", "trajectory", "aclose")


def is_client_env(cls: Any) -> bool:
    """Whether `cls` is a client env class (`run`, `tasks`, `from_options`) rather than an episode env class."""
    return isinstance(cls, type) and isinstance(cls, ClientEnv)


def check_env_class(cls: Any, key: str = "env.class") -> Any:
    """`cls` if it is an episode env class or a client env class; one ConfigError naming what it lacks otherwise."""
    name = getattr(cls, "__qualname__", None) or repr(cls)
    if not isinstance(cls, type):
        raise ConfigError(key, f"{name} is not a class: env.class names an env class (see agentenv.envs.parts)")
    if is_client_env(cls):
        return cls
    if not (isinstance(cls, EnvClass) and isinstance(cls, EpisodeEnv)):
        missing = [m for m in ("from_inputs", "can_fork", *_EPISODE_MEMBERS) if not hasattr(cls, m)]  # for the message
        raise ConfigError(
            key,
            f"{cls.__module__}.{name} is not an env class: it lacks {', '.join(missing)} (an episode env satisfies "
            "agentenv.envs.EpisodeEnv and has a classmethod from_inputs(EnvInputs) and a bool can_fork; see "
            "agentenv.envs.parts)",
        )
    if not isinstance(cls.can_fork, bool):
        raise ConfigError(key, f"{cls.__module__}.{name}.can_fork must be True or False, got {cls.can_fork!r}")
    return cls


ENVS: Registry[type] = Registry("env class", "env.class", group="agentenv.envs", adapt=check_env_class)
ENVS.register("agent", "agentenv.envs.agent_env:AgentEnv")
ENVS.register("verifiers", "agentenv.envs.verifiers:VerifiersEnv")
ENVS.register("openenv", "agentenv.envs.openenv:OpenEnvEnv")


def register_env_class(name: str, cls: type | str, *, overwrite: bool = False) -> None:
    """Register an env class (or its lazy `"module:attr"`) under `name` for `env.class`."""
    ENVS.register(name, cls, overwrite=overwrite)


@dataclass(frozen=True)
class EnvSpec:
    """`env.class` resolved: the class, its validated options, and what it can do.

    Attributes:
        name: What `env.class` says.
        cls: The env class.
        options: Its validated options (`config_cls` instance, or a dict).
    """

    name: str
    cls: type
    options: Any

    @property
    def can_fork(self) -> bool:
        return isinstance(self.cls, EnvClass) and self.cls.can_fork  # a client env forks no episode

    @property
    def drives_client(self) -> bool:
        """A client env (run against the endpoint) rather than an episode env."""
        return is_client_env(self.cls)

    def client_env(self) -> ClientEnv:
        """The client env built from its options (a client env only)."""
        made: ClientEnv = self.cls.from_options(self.options)  # type: ignore[attr-defined]  # drives_client checked by the caller
        return made


def resolve_env(name: str, options: Any, key: str = "env") -> EnvSpec:
    """The env class `name` names, with `options` checked by its `config_cls` (errors name `key.options.<field>`)."""
    from agentenv.loader import build_dataclass

    cls = ENVS.get(name, f"{key}.class")
    if isinstance(cls, HasConfigClass) and cls.config_cls is not None:
        checked = build_dataclass(cls.config_cls, options, f"{key}.options")
    else:
        if options:
            raise ConfigError(f"{key}.options", f"env class {name!r} takes no options, got {dict(options)!r}")
        checked = {}
    return EnvSpec(name, cls, checked)


def build_env(spec: EnvSpec, inputs: EnvInputs) -> EpisodeEnv:
    """One episode env of `spec` (an episode env class)."""
    if spec.drives_client:
        raise ConfigError("env.class", f"{spec.name!r} drives its own client: it runs against the endpoint, not as an episode env")
    env: EpisodeEnv = spec.cls.from_inputs(inputs)  # type: ignore[attr-defined]  # an EnvClass (check_env_class)
    return env


def env_factory(spec: EnvSpec, config: AgentEnvConfig, tools: Sequence[Tool], tokenizer: Tokenizer, reward_fn: RewardFn) -> MakeEnv:
    """A zero-argument factory of fresh episode envs over the prototype tools."""
    inputs = EnvInputs(config, spec.options, tuple(tools), tokenizer, reward_fn)

    def make_env() -> EpisodeEnv:
        return build_env(spec, inputs)

    return make_env


__all__ = [
    "ENVS",
    "ClientEnv",
    "EnvClass",
    "EnvInputs",
    "EnvSpec",
    "build_env",
    "check_env_class",
    "env_factory",
    "register_env_class",
    "resolve_env",
]
