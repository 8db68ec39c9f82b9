"""`TextEnv`: a multi-turn env in chat turns, for games, simulators and adapters.

The policy writes an assistant turn (ending at EOS); the env answers it with
a message (a `user` turn by default) or ends the episode with a reward. A
subclass writes only the game:

    class GuessEnv(TextEnv):
        def begin(self, task):            # the prompt messages; set up the episode's state
            self.secret = int(task.ground_truth)
            return task.messages
        async def respond(self, text):    # the policy's turn as text -> the env's answer
            ...
            return Reply("higher")        # or Reply(done=True, reward=1.0, correct=True)

The token mechanics are the same as `AgentEnv`'s `hermes` format: the policy's
tokens stay as sampled; the env appends the chat template's text from the end
of the policy's turn to where the next assistant turn begins, tokenized whole
(loss mask 0), and checks that the context equals the conversation rendered
from scratch (`agentenv.envs.chat.check_from_scratch`). The template is
`env.chat_template` (None: the tokenizer's own).

State in plain immutable attributes (ints, strings, tuples) is copied by
`fork()`; a subclass with mutable state extends `fork`.
"""

from __future__ import annotations

import copy
import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from gymnasium.error import ResetNeeded

from agentenv.envs.chat import ChatTemplate, check_from_scratch
from agentenv.envs.config import AgentEnvConfig
from agentenv.envs.episode import Observation, StepResult
from agentenv.envs.spaces import action_ids, as_token_array
from agentenv.envs.sync import SyncRunner
from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.tasks.rewards import RewardError, check_reward
from agentenv.tasks.task import Task
from agentenv.types import Generation, Segment, Tokenizer, Trajectory

if TYPE_CHECKING:
    from agentenv.envs.parts import EnvInputs


@dataclass(frozen=True)
class Reply:
    """The env's answer to one policy turn.

    Attributes:
        text: The message the policy reads next (ignored when `done`).
        done: The episode ends now.
        reward: The episode's reward (read when `done`).
        correct: Whether the episode counts as solved (accuracy, pass@k).
        role: The role of the message (`user`, or `tool` for a template with tool turns).
        info: Anything worth logging on the trajectory (`info["env"]`).
    """

    text: str = ""
    done: bool = False
    reward: float = 0.0
    correct: bool = False
    role: Literal["user", "tool"] = "user"
    info: Mapping[str, Any] = field(default_factory=dict)


class TextEnv(ABC):
    """A multi-turn chat env: subclasses write `begin` and `respond` (see the module docstring).

    Args:
        tokenizer: The policy's tokenizer.
        config: The run's `env` section (budget, chat template); default: its defaults.
        options: The subclass's own options (`env.options`, built as its `config_cls`).
    """

    can_fork: ClassVar[bool] = True
    config_cls: ClassVar[type | None] = None

    @classmethod
    def from_inputs(cls, inputs: EnvInputs) -> TextEnv:
        return cls(inputs.tokenizer, inputs.config, inputs.options)

    def __init__(self, tokenizer: Tokenizer, config: AgentEnvConfig | Mapping[str, Any] | None = None,
                 options: Any = None):  # fmt: skip
        self.config = build_dataclass(AgentEnvConfig, config, "env")
        if self.config_cls is not None:
            options = build_dataclass(self.config_cls, options, "env.options")
        self.options = options if options is not None else {}
        self.tokenizer = tokenizer
        self.chat = ChatTemplate.from_config(tokenizer, self.config.chat_template, self.config.chat_template_kwargs)
        if not self.chat.available:
            raise ConfigError("env.chat_template", f"{type(self).__name__} renders chat turns, and {self.chat.name} "
                              "has no template: set env.chat_template (e.g. chatml_hermes)")  # fmt: skip
        self._eos_id: int | None = tokenizer.eos_token_id
        self._vocab_size = len(tokenizer)
        self.np_random = np.random.default_rng()
        self._sync = SyncRunner(type(self).__name__, "areset")
        self._clear()

    def _clear(self) -> None:
        self._started = False
        self._done = False
        self._task: Task | None = None
        self._messages: list[dict[str, Any]] = []
        self._text = ""  # the template's text of the context so far
        self._context: list[int] = []
        self._segments: list[Segment] = []
        self._turns = 0
        self._reward = 0.0
        self._reward_info: dict[str, Any] = {}
        self._env_info: dict[str, Any] = {}
        self._finish_reason = "running"
        self._uid = uuid.uuid4().hex[:12]
        self._parent_uid: str | None = None
        self._branch_token: int | None = None

    # ---- the game: what a subclass writes -------------------------------
    def begin(self, task: Task) -> Sequence[Mapping[str, Any]]:
        """Set up the episode's state for `task`; returns the prompt messages (default: the task's)."""
        return task.messages

    async def abegin(self, task: Task) -> Sequence[Mapping[str, Any]]:
        """`begin` for a game that starts with a round trip (a remote server's reset); default: `begin`."""
        return self.begin(task)

    @abstractmethod
    async def respond(self, text: str) -> Reply:
        """The env's answer to the policy's turn (`text`, special tokens left out)."""

    # ---- EpisodeEnv -----------------------------------------------------
    @property
    def context(self) -> list[int]:
        return list(self._context)

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.config.max_context_tokens - len(self._context))

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return ()  # a turn ends at EOS

    @property
    def done(self) -> bool:
        return self._done

    @property
    def turns(self) -> int:
        """Policy turns taken this episode."""
        return self._turns

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Synchronous `areset`, on the env's own event loop."""
        return self._sync.run(self.areset(seed=seed, options=options), "reset")

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Start an episode on `options["task"]`; `seed` seeds `np_random` (for a game's own draws)."""
        task = (options or {}).get("task")
        if not isinstance(task, Task):
            raise TypeError(f"{type(self).__name__}.reset needs options={{'task': Task}}, got {task!r}")
        self._clear()
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        messages = [dict(m) for m in await self.abegin(task)]
        text = self.chat.render(messages, add_generation_prompt=True)
        prompt = self.chat.encode(text)
        if len(prompt) >= self.config.max_context_tokens:
            raise ConfigError("env.max_context_tokens", f"task {task.id!r} has a {len(prompt)}-token prompt; "
                              f"{self.config.max_context_tokens} leaves no room for the policy")  # fmt: skip
        self._started, self._task, self._messages, self._text = True, task, messages, text
        self._append(Segment("prompt", prompt))
        return as_token_array(prompt), {"task_id": task.id, "prompt_tokens": len(prompt)}

    async def astep(self, action: Generation | Sequence[int] | np.ndarray) -> StepResult:
        if not self._started or self._done:
            raise ResetNeeded(f"{type(self).__name__}.astep needs a running episode: call reset(...) first")
        ids, seg = self._turn(action)
        self._append(seg)
        self._turns += 1
        turn_text = self.chat.decode(ids)
        reply = await self.respond(self.tokenizer.decode(ids, skip_special_tokens=True))
        if reply.info:
            self._env_info.update(reply.info)
        if reply.done:
            return self._finish("done", self._gated(reply.reward), reply.correct, terminated=True)
        if self.remaining_tokens <= 0:
            return self._finish("context", 0.0, False, truncated=True)
        content = turn_text
        eos_text = self.chat.decode([self._eos_id]) if self._eos_id is not None else ""
        if eos_text and content.endswith(eos_text):
            content = content[: -len(eos_text)]
        messages = [*self._messages, {"role": "assistant", "content": content}, {"role": reply.role, "content": reply.text}]
        rendered = self.chat.render(messages, add_generation_prompt=True)
        start = self._text + turn_text
        if not rendered.startswith(start):
            raise ConfigError("env.chat_template", f"{self.chat.name} does not render the policy's turn as it was "
                              "written, so the env's answer cannot follow it token-exactly")  # fmt: skip
        obs = self.chat.encode(rendered[len(start):])
        if len(obs) > self.remaining_tokens:
            return self._finish("context", 0.0, False, truncated=True)
        self._messages, self._text = messages, rendered
        self._append(Segment("tool", obs))
        check_from_scratch(self.chat, self._segments, rendered)
        # tool_result: the env's answer is a node a tree sampler may branch at (as after a tool's output)
        return StepResult(as_token_array(obs), 0.0, False, False, {"turn": self._turns, "tool_result": True})

    def _turn(self, action: Any) -> tuple[list[int], Segment]:
        if isinstance(action, Generation):
            ids = action_ids(np.asarray(action.token_ids) if action.token_ids else [], self._vocab_size)
            versions = list(action.versions) if action.versions is not None else None
            seg = Segment("policy", ids, list(action.logprobs), list(action.entropies), versions)
        else:
            ids = action_ids(action, self._vocab_size)
            seg = Segment("policy", ids, [math.nan] * len(ids), [math.nan] * len(ids))
        if len(ids) > self.remaining_tokens:
            raise ValueError(f"the action has {len(ids)} tokens but only {self.remaining_tokens} remain of the "
                             f"context budget (env.max_context_tokens={self.config.max_context_tokens})")  # fmt: skip
        return ids, seg

    def _gated(self, reward: Any) -> float:
        """The game's reward through the gate every reward passes (`agentenv.tasks.rewards.check_reward`): a
        finite number (a game declares its own range), or the trajectory fails with the kind counted.

        Raises:
            RewardError: NaN, inf or not a number.
        """
        try:
            return check_reward(reward, (-math.inf, math.inf), f"{type(self).__name__}'s reward")
        except RewardError as e:
            self._reward, self._reward_info = 0.0, {"score": 0.0, "correct": False, "format_ok": False, "error": e.kind}
            raise

    def _finish(self, reason: str, reward: float, correct: bool, *, terminated: bool = False,
                truncated: bool = False) -> StepResult:  # fmt: skip
        self._done, self._finish_reason, self._reward = True, reason, float(reward)
        self._reward_info = {"score": self._reward, "correct": bool(correct), "format_ok": True}
        info = {"turn": self._turns, "finish_reason": reason, "reward": dict(self._reward_info)}
        return StepResult(as_token_array([]), self._reward, terminated, truncated, info)

    def _append(self, seg: Segment) -> None:
        self._segments.append(seg)
        self._context.extend(seg.token_ids)

    def trajectory(self) -> Trajectory:
        return Trajectory(
            task_id=self._task.id if self._task is not None else "",
            segments=[copy.deepcopy(s) for s in self._segments],
            reward=self._reward,
            finish_reason=self._finish_reason,
            uid=self._uid,
            parent_uid=self._parent_uid,
            branch_token=self._branch_token,
            info={"turns": self._turns, "reward": dict(self._reward_info), "env": dict(self._env_info)},
        )

    def fork(self) -> TextEnv:
        """An independent copy of the episode (its token state, and the subclass's attributes, shallowly)."""
        new = copy.copy(self)
        new._sync = SyncRunner(type(self).__name__, "areset")
        new._messages = [dict(m) for m in self._messages]
        new._context = list(self._context)
        new._segments = [copy.deepcopy(s) for s in self._segments]
        new._reward_info = dict(self._reward_info)
        new._env_info = dict(self._env_info)
        new.np_random = copy.deepcopy(self.np_random)
        new._uid = uuid.uuid4().hex[:12]
        new._parent_uid = self._uid
        new._branch_token = len(self._context)
        return new

    async def aclose(self) -> None:  # noqa: B027 - a hook with a default: most games hold nothing to close
        """Nothing to close (a subclass holding a connection closes it here)."""


__all__ = ["Reply", "TextEnv"]
