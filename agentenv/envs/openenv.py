"""`env.class: openenv`: an OpenEnv server (Meta's `openenv-core`: Gym-style `reset`/`step` over WebSocket) as the env.

    env:
      class: openenv
      options:
        url: http://127.0.0.1:8000     # a running server (started apart: a process, a container)
        action_field: message          # the action's field the policy's text goes into
        observation_field: null        # the observation's field shown to the policy (null: all of it, as JSON)
      tasks: {source: jsonl, train_path: prompts.jsonl}   # the instructions each episode starts with

Each episode opens its own server session (a WebSocket, `openenv.core.GenericEnvClient`):
`reset` at the episode's start, one `step` per policy turn, and the session is
closed when the episode ends, fails or is cancelled (the rollout engine closes
every episode's env; a killed process drops the connection, which ends the
session on the server). Observations are rendered into chat turns (a `TextEnv`);
the policy's text (special tokens left out, stripped) becomes the action's
`action_field`; reward and done come from the server (the episode's reward is
the sum of its steps'). A server session cannot be copied, so the env cannot
fork: tree samplers (ARPO) refuse it.

A server that is down, does not answer within `message_timeout_s`, or answers
with something that is not an observation raises `InfraError` naming the URL:
that episode fails (masked from the loss), the others go on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from agentenv.envs.text_env import Reply, TextEnv
from agentenv.errors import ConfigError, InfraError
from agentenv.loader import check_number
from agentenv.tasks.task import Task

_HIDDEN = ("reward", "done", "metadata")  # observation fields the policy is not shown


@dataclass(frozen=True)
class OpenEnvConfig:
    """`env.options` of `env.class: openenv`.

    Attributes:
        url: Base URL of the server (`http://` or `ws://`); its `/ws` serves sessions.
        action_field: The field of the server's action type the policy's text fills.
        observation_field: The observation field shown to the policy; None: every
            field but reward, done and metadata, as JSON.
        connect_timeout_s: Limit of opening a session.
        message_timeout_s: Limit of one reset or step answer.
    """

    url: str = ""
    action_field: str = "message"
    observation_field: str | None = None
    connect_timeout_s: float = 10.0
    message_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ConfigError("url", f"must be the server's base URL (http://host:port), got {self.url!r}")
        if not self.action_field:
            raise ConfigError("action_field", "must name a field of the server's action")
        check_number("connect_timeout_s", self.connect_timeout_s)
        check_number("message_timeout_s", self.message_timeout_s)


class OpenEnvEnv(TextEnv):
    """An OpenEnv server's episodes, one session each (see the module docstring)."""

    can_fork: ClassVar[bool] = False
    config_cls: ClassVar[type] = OpenEnvConfig
    options: OpenEnvConfig

    _client: Any = None
    _total = 0.0

    def _fail(self, what: str) -> InfraError:
        return InfraError(f"the OpenEnv server at {self.options.url} (env.options.url) {what}")

    async def _call(self, coro: Any, doing: str, observe: bool = True) -> Any:
        try:
            result = await coro
        except TimeoutError:
            raise self._fail(f"did not answer {doing} within {self.options.message_timeout_s:g} s "
                             "(env.options.message_timeout_s)") from None  # fmt: skip
        except ConnectionError as e:
            raise self._fail(f"is not reachable: {e}") from None
        except Exception as e:  # noqa: BLE001 - a server error, a dropped socket, bad JSON: all the server's fault
            raise self._fail(f"failed {doing}: {type(e).__name__}: {e}") from None
        if not observe:
            return result
        obs = result.observation
        if not isinstance(obs, Mapping) or (self.options.observation_field is not None and
                                            self.options.observation_field not in obs):  # fmt: skip
            raise self._fail(f"answered {doing} with a malformed observation: {str(obs)[:200]!r}")
        reward = result.reward
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise self._fail(f"answered {doing} with a reward that is no number: {reward!r}")
        return result

    def _render(self, obs: Mapping[str, Any]) -> str:
        field = self.options.observation_field
        if field is not None:
            value = obs[field]
            return value if isinstance(value, str) else json.dumps(value)
        return json.dumps({k: v for k, v in obs.items() if k not in _HIDDEN})

    async def abegin(self, task: Task) -> Sequence[Mapping[str, Any]]:
        from openenv.core import GenericEnvClient

        await self.aclose()  # a reset of a used env: its old session ends first
        self._client = GenericEnvClient(self.options.url, connect_timeout_s=self.options.connect_timeout_s,
                                        message_timeout_s=self.options.message_timeout_s)  # fmt: skip
        self._total = 0.0
        await self._call(self._client.connect(), "a new session", observe=False)
        result = await self._call(self._client.reset(), "reset")
        return [*task.messages, {"role": "user", "content": self._render(result.observation)}]

    async def respond(self, text: str) -> Reply:
        result = await self._call(self._client.step({self.options.action_field: text.strip()}), "a step")
        self._total += float(result.reward or 0.0)
        if result.done:
            await self.aclose()
            return Reply(done=True, reward=self._total, correct=self._total > 0)
        return Reply(self._render(result.observation))

    def fork(self) -> TextEnv:
        raise ConfigError("env.class", "an OpenEnv server session cannot be forked (use an independent-sampler algorithm)")

    async def aclose(self) -> None:
        """End the episode's server session (idempotent)."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()


__all__ = ["OpenEnvConfig", "OpenEnvEnv"]
