"""The rollout's settings: the run config's `rollout` section."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentenv.errors import ConfigError
from agentenv.loader import check_number
from agentenv.rollout.endpoint.config import EndpointConfig

__all__ = ["MIN_EPISODE_TIMEOUT_S", "RolloutConfig"]

MIN_EPISODE_TIMEOUT_S = 1.0
"""Below this no trajectory can finish (one generation alone takes longer)."""


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are driven: the run config's `rollout` section.

    A turn's token budget is `SamplingParams.max_tokens` (the run's
    `policy.max_turn_tokens`), within the env's remaining context.

    Attributes:
        generation_timeout_s: Wall-clock limit of one `generate` call; None for no limit.
            Never longer than `episode_timeout_s` (see `generation_limit_s`).
        episode_timeout_s: Wall-clock limit of one trajectory (one episode, or one
            path of a tree from where it starts); a trajectory past it is recorded
            as failed and the rest of its group goes on. None for no limit; at
            least `MIN_EPISODE_TIMEOUT_S`.
        max_concurrency: Most episodes in flight at once per sampler (in a run:
            over the whole rollout batch of a step).
        agent: A user's agent, `package.module:attr`: an async function
            `(client, task) -> str | float` given an `openai.AsyncOpenAI` client
            pointed at the endpoint over the training policy. Set, it replaces
            the env's episode loop: every request is recorded token-exact
            (`agentenv.rollout.endpoint`); a `str` is scored by `env.reward`, a
            `float` is the reward. None: the env drives the policy.
        endpoint: The endpoint the agent talks to (`agentenv.rollout.endpoint.config.EndpointConfig`).
    """

    generation_timeout_s: float | None = 600.0
    episode_timeout_s: float | None = 300.0
    max_concurrency: int = 256
    agent: str | None = None
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)

    def __post_init__(self) -> None:
        if self.generation_timeout_s is not None:
            check_number("rollout.generation_timeout_s", self.generation_timeout_s)
        if self.episode_timeout_s is not None:
            check_number("rollout.episode_timeout_s", self.episode_timeout_s, low=MIN_EPISODE_TIMEOUT_S, low_ok=True)
        check_number("rollout.max_concurrency", self.max_concurrency, low=1, low_ok=True, integer=True)
        if self.agent is not None:
            from agentenv.registry import is_import_path

            if not is_import_path(self.agent):
                raise ConfigError("rollout.agent", f"must be 'package.module:attr' naming an async function, got {self.agent!r}")

    @property
    def generation_limit_s(self) -> float | None:
        """The limit one `generate` call gets: the generation's, capped by the episode's."""
        limits = [v for v in (self.generation_timeout_s, self.episode_timeout_s) if v is not None]
        return min(limits) if limits else None
