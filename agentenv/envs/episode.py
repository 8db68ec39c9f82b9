"""The episode interface the rollout engine drives: `EpisodeEnv`.

`AgentEnv` is the implementation; the rollout engine (`agentenv.rollout.engine.Episode`)
and the tree samplers use nothing of it beyond these members. A gymnasium
wrapper is looked through (`env.unwrapped`) because wrappers are sync-only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import gymnasium
import numpy as np

from agentenv.types import Generation, Trajectory

Observation = np.ndarray
"""Token ids (int64), a fresh array: never shared with the env's state."""


class StepResult(NamedTuple):
    """One env step: gymnasium's (observation, reward, terminated, truncated, info), with names.

    It unpacks as gymnasium's 5-tuple; a sampler reads the field it needs by name.
    """

    observation: Observation
    """The token ids appended after the turn (a tool's result; empty when none)."""
    reward: float
    """Non-zero only at the end."""
    terminated: bool
    """The episode ended by the policy (answer or EOS)."""
    truncated: bool
    """The episode was cut (length, context, tool limit)."""
    info: dict[str, Any]

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@runtime_checkable
class EpisodeEnv(Protocol):
    """One token-level episode, stepped asynchronously and forkable mid-way.

    `reset` starts an episode on `options["task"]` (`areset` on the event loop,
    which the rollout engine calls: an env may need a round trip to start,
    such as a remote server's reset); `astep` takes one policy
    turn (a `Generation` or its token ids), runs the tool calls it makes and
    returns the tokens appended after it; `fork` copies the episode (context,
    counters, tools) for a branch; `trajectory` is the episode so far;
    `aclose` closes the episode's tools (idempotent).
    """

    @property
    def context(self) -> list[int]:
        """Every token of the episode so far (prompt, turns, tool results)."""
        ...

    @property
    def remaining_tokens(self) -> int:
        """Tokens the context may still grow by."""
        ...

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Strings that end a policy turn (a tool call's closing tag)."""
        ...

    @property
    def done(self) -> bool: ...

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]: ...

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]: ...

    async def astep(self, action: Generation | Sequence[int] | np.ndarray) -> StepResult: ...

    def fork(self) -> EpisodeEnv: ...

    def trajectory(self) -> Trajectory: ...

    async def aclose(self) -> None: ...


AnyEnv = EpisodeEnv | gymnasium.Env[Any, Any]
"""What a rollout accepts: an `EpisodeEnv`, or a gymnasium wrapper around one (looked through)."""

MakeEnv = Callable[[], AnyEnv]
"""A factory of fresh episode envs (one per episode)."""


__all__ = ["AnyEnv", "EpisodeEnv", "MakeEnv", "Observation", "StepResult"]
