"""A user's env, written outside the package: guess the hidden number (docs/envs/index.md shows it whole).

    env:
      class: guess_env:GuessEnv
      options: {max_guesses: 4}
      tasks: {source: guess_env:guess_tasks, n: 16, high: 8}

The hidden number is the task's ground truth; the policy guesses, the env says
"higher" or "lower"; the reward is 1 for a first-turn hit, less for each turn
used, 0 when the guesses run out. Its state is two ints, so `fork()` copies it
(ARPO may branch after any answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentenv.envs import Reply, TextEnv
from agentenv.errors import ConfigError
from agentenv.tasks import Task, TaskSet

_NUMBER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class GuessConfig:
    """`env.options` of the game.

    Attributes:
        max_guesses: Turns before the episode ends unsolved.
    """

    max_guesses: int = 4

    def __post_init__(self) -> None:
        if self.max_guesses < 1:
            raise ConfigError("max_guesses", f"must be at least 1, got {self.max_guesses}")


class GuessEnv(TextEnv):
    config_cls = GuessConfig
    options: GuessConfig

    def begin(self, task: Task):
        self.secret = int(task.ground_truth)
        return task.messages

    async def respond(self, text: str) -> Reply:
        guesses = _NUMBER.findall(text)
        last = self.turns >= self.options.max_guesses
        if not guesses:
            return Reply("Answer with one number.", done=last)
        guess = int(guesses[-1])
        if guess == self.secret:
            return Reply(done=True, reward=1.0 - (self.turns - 1) / self.options.max_guesses, correct=True,
                         info={"guesses": self.turns})  # fmt: skip
        return Reply("higher" if guess < self.secret else "lower", done=last, info={"guesses": self.turns})


@dataclass(frozen=True)
class GuessTasks:
    """Options of the game's task source: `n` games with hidden numbers in [1, high]."""

    n: int = 16
    high: int = 8


def guess_tasks(cfg: GuessTasks) -> TaskSet:
    """`n` training games and 4 held-out ones."""
    question = f"I am thinking of a number from 1 to {cfg.high}. Guess it: answer with one number."
    games = [Task(f"guess-{i}", ({"role": "user", "content": question},), str(1 + (i * 5) % cfg.high))
             for i in range(cfg.n + 4)]  # fmt: skip
    return TaskSet(games[: cfg.n], games[cfg.n :])


guess_tasks.config_cls = GuessTasks  # type: ignore[attr-defined]  # the task source's options (agentenv.registry.as_part)


class OneWayGuessEnv(GuessEnv):
    """The same game, declared unforkable (as an env over a remote session is): ARPO refuses it by name."""

    can_fork = False


class ConfiguredGuessEnv(GuessEnv):
    """The same game with a `from_options` helper of its own: an episode env still (it has no `run` or `tasks`)."""

    @classmethod
    def from_options(cls, options: GuessConfig) -> GuessConfig:
        return options


class NotAnEnv:
    """Has a reset and nothing else of an episode env."""

    def reset(self, *, seed=None, options=None):
        return [], {}
