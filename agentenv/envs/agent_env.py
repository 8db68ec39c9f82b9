"""AgentEnv: one episode of one Task, over several tools, in tokens.

The context is a list of token ids that only grows by appending. Every token is
created inside a `Segment` that knows its source: the prompt and tool results
are made here with loss mask 0, the policy's turns with mask 1.

Episode flow: `reset` renders the task's prompt; each `step` takes the policy's
turn (up to a closing tool tag such as `</python>`, `</answer>` or EOS), parses
it, and either ends the episode (answer, EOS, context full, unfinished turn) or
answers the call as the next observation. How calls and results are written is
the env's tool-call format (`env.tool_format`: `tags`, results as `<result>`
blocks; `hermes`, results as `tool` turns of the chat template); after each
result the format checks that the context equals the conversation rendered from
scratch. The reward is non-zero only at the end.
"""

from __future__ import annotations

import copy
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.error import ResetNeeded

from agentenv.envs.config import AgentEnvConfig
from agentenv.envs.episode import Observation, StepResult
from agentenv.envs.formats import TOOL_FORMATS
from agentenv.envs.parsing import RESERVED_TAGS, ParsedTurn
from agentenv.envs.results import call_tool, close_tool, frame_off_loop, result_text
from agentenv.envs.spaces import TokenSequence, action_ids, as_token_array
from agentenv.envs.state import ContextHash
from agentenv.envs.sync import SyncRunner
from agentenv.errors import ConfigError, ToolError
from agentenv.loader import build_dataclass
from agentenv.tasks.prompts import is_prefilled
from agentenv.tasks.task import Task
from agentenv.tools.base import Tool
from agentenv.types import Generation, PolicyText, Segment, Tokenizer, Trajectory

if TYPE_CHECKING:
    from agentenv.envs.parts import EnvInputs

# reward_fn(policy_text, task, tool_calls) -> object with .score, .correct, .format_ok (agentenv.tasks.rewards)
RewardFn = Callable[[str, Task, dict[str, int]], Any]

_TAG_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _check_tools(tools: Sequence[Tool]) -> dict[str, Tool]:
    out: dict[str, Tool] = {}
    for t in tools:
        if not isinstance(t, Tool):
            raise ConfigError("env.tools", f"{type(t).__name__} is not a Tool: it needs a name, an async __call__(query), "
                              "fork() and aclose() (see agentenv.tools.base.Tool)")  # fmt: skip
        name = t.name
        if not isinstance(name, str) or not name or not set(name) <= _TAG_NAME_CHARS or not (name[0].isalpha() or name[0] == "_"):
            raise ConfigError("env.tools", f"tool name {name!r} cannot be a tag: use letters, digits, _ . -")
        if name in RESERVED_TAGS:
            raise ConfigError("env.tools", f"tool name {name!r} is reserved (reserved: {', '.join(RESERVED_TAGS)})")
        if name in out:
            raise ConfigError("env.tools", f"two tools are named {name!r}; tool names are tags and must be unique")
        out[name] = t
    return out


class AgentEnv(gymnasium.Env):
    """One episode of one Task: the policy's turns in, tool results out, as token ids.

    Observations and actions are `TokenSequence` spaces (int64 arrays of token
    ids). An action is the policy's turn: an `agentenv.types.Generation` (its
    logprobs and entropies are recorded in the policy Segment) or a sequence of
    token ids (recorded with NaN logprobs and entropies).

    Use `astep` inside an event loop (the rollout engine does); `step` runs it
    on the env's own loop for synchronous callers.

    Tool lifecycle: the tools given here are prototypes. `reset` forks each into
    the episode's own tool; `fork()` forks the episode's tools; `aclose()` (or
    `close()`) closes the episode's tools. Prototypes are closed only by
    `close()` and only when `owns_tools` (the registry's factories set it for
    tools they built).

    Args:
        tools: Prototype tools; each `Tool.name` is the tag the model writes.
        tokenizer: The policy's tokenizer (HF-style `encode`/`decode`, `eos_token_id`).
        reward_fn: `reward_fn(policy_text, task, tool_calls)` returning an
            object with `.score`, `.correct`, `.format_ok`. It sees only what
            the policy wrote (`policy_text`, a `PolicyText` whose `turns` are
            its turns apart) and the tool-call counts, never a tool's text.
            Default: `agentenv.tasks.rewards.arpo_reward`, which reads each
            turn alone.
        config: `AgentEnvConfig` or a mapping of its fields.
        tasks: Tasks to draw from (with the seeded `np_random`) when `reset`
            gets no `options={"task": ...}`.
        owns_tools: Close the prototypes in `close()`.
    """

    metadata = {"render_modes": []}
    can_fork: ClassVar[bool] = True
    """`fork()` copies the episode and forks its tools (the ARPO tree sampler relies on it)."""

    @classmethod
    def from_inputs(cls, inputs: EnvInputs) -> AgentEnv:
        """`env.class: agent`: an AgentEnv over the run's tools, reward and `env` section."""
        return cls(list(inputs.tools), inputs.tokenizer, reward_fn=inputs.reward_fn, config=inputs.config)

    def __init__(
        self,
        tools: Sequence[Tool],
        tokenizer: Tokenizer,
        reward_fn: RewardFn | None = None,
        config: AgentEnvConfig | Mapping[str, Any] | None = None,
        tasks: Sequence[Task] | None = None,
        *,
        owns_tools: bool = False,
    ):
        self.config = build_dataclass(AgentEnvConfig, config, "env")
        self.tokenizer = tokenizer
        self._prototypes = _check_tools(tools)
        self._reward_fn = reward_fn
        self.tasks: tuple[Task, ...] = tuple(tasks or ())
        self._owns_tools = owns_tools
        self._format = TOOL_FORMATS.get(self.config.tool_format).bind(tokenizer, self.config, self._prototypes)
        self._eos_id: int | None = tokenizer.eos_token_id
        self._vocab_size = len(tokenizer)
        self.observation_space = TokenSequence(self._vocab_size)
        self.action_space = TokenSequence(self._vocab_size, end_token_id=self._eos_id)
        self._sync = SyncRunner(type(self).__name__, "astep")
        self._closed = False
        self._clear_episode()

    # ---- episode state -------------------------------------------------

    def _clear_episode(self) -> None:
        self._started = False
        self._task: Task | None = None
        self._context: list[int] = []
        self._context_hash = ContextHash()
        self._state_keys: list[str] = []  # the state key before each policy turn
        self._segments: list[Segment] = []
        self._messages: list[dict[str, Any]] = []  # the episode as chat messages (how the format renders it)
        self._response_prefix = ""  # a prefill the task's messages end with: the start of the first turn
        self._tools: dict[str, Tool] = {}
        self._tool_calls: dict[str, int] = {}
        self._tool_time_s = 0.0
        self._tool_time_by_name: dict[str, float] = {}
        self._tool_errors: dict[str, dict[str, int]] = {}  # tool -> ToolResult.kind -> failed calls
        self._tool_error_text: dict[str, str] = {}  # "tool/kind" -> the first such error, for warnings
        self._calls: list[dict[str, Any]] = []  # per answered call: its result's segment, tool, ok, error kind
        self._turns = 0
        self._limit_warned = False
        self._reward = 0.0
        self._reward_info: dict[str, Any] = {}
        self._finish_reason = "running"
        self._done = False
        self._uid = uuid.uuid4().hex[:12]
        self._parent_uid: str | None = None
        self._branch_token: int | None = None

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(self._prototypes)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Where a turn ends in the env's tool-call format (`tags`: the tools' closing tags, then
        `</answer>`; `hermes`: `</tool_call>`, `</answer>`): pass them as `SamplingParams.stop`."""
        return tuple(self._format.stop_strings)

    @property
    def context(self) -> list[int]:
        """A copy of the episode's token ids so far (prompt, turns, results)."""
        return list(self._context)

    @property
    def task(self) -> Task | None:
        return self._task

    @property
    def remaining_tokens(self) -> int:
        """Tokens left in the context budget."""
        return max(0, self.config.max_context_tokens - len(self._context))

    @property
    def done(self) -> bool:
        return self._done

    @property
    def finish_reason(self) -> str:
        return self._finish_reason

    @property
    def episode_tools(self) -> Mapping[str, Tool]:
        """The episode's own (forked) tools, by name."""
        return dict(self._tools)

    @property
    def prompt_len(self) -> int:
        return len(self._segments[0]) if self._segments else 0

    def state_key(self) -> str:
        """The name of the state the episode stands in: a hash of the context so far.

        The policy acts from its context alone, and a tool's state follows from
        the calls already in it, so equal contexts are equal states (GiGPO's
        anchor states; a fork stands in its parent's state). Each turn's key is
        recorded in `Trajectory.state_keys`.
        """
        return self._context_hash.key()

    def prompt_ids(self, task: Task) -> list[int]:
        """The prompt `reset` would start `task` with (the tools' schemas included where the format shows
        them), without starting an episode: what a build checks against `max_context_tokens`."""
        return list(self._format.prompt(task.messages)[1])

    # ---- gymnasium API --------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Start an episode.

        Args:
            seed: Seeds `np_random` (used to draw a task when none is given).
            options: `{"task": Task}`; without it a task is drawn from `tasks`.

        Returns:
            (prompt token ids as an int64 array, info with `task_id`, `prompt_tokens`).
        """
        super().reset(seed=seed)
        if self._closed and self._owns_tools:
            raise ResetNeeded(f"{type(self).__name__} was closed with the tools it owned; make a new env")
        self._closed = False
        task = (options or {}).get("task")
        if task is None:
            if not self.tasks:
                raise ValueError(
                    "AgentEnv.reset needs a task: pass options={'task': task} or give tasks= to the constructor"
                )
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if not isinstance(task, Task):
            raise TypeError(f"options['task'] must be an agentenv Task, got {type(task).__name__}")
        messages, prompt = self._format.prompt(task.messages)
        if len(prompt) >= self.config.max_context_tokens:
            raise ConfigError(
                "env.max_context_tokens",
                f"task {task.id!r} has a {len(prompt)}-token prompt; max_context_tokens "
                f"{self.config.max_context_tokens} leaves no room for the policy",
            )
        self._discard_tools(self._tools)
        self._clear_episode()
        self._started = True
        self._task = task
        self._messages = messages
        self._response_prefix = messages[-1]["content"] if is_prefilled(messages) else ""
        self._tools = {name: proto.fork() for name, proto in self._prototypes.items()}
        self._append(Segment("prompt", prompt))
        return as_token_array(prompt), {"task_id": task.id, "prompt_tokens": len(prompt)}

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """`reset`, on the event loop (it needs no round trip)."""
        return self.reset(seed=seed, options=options)

    def step(self, action: Generation | Sequence[int] | np.ndarray) -> StepResult:
        """Synchronous `astep`, run on the env's own event loop.

        Raises:
            RuntimeError: When called inside a running event loop (use `await env.astep(action)`).
        """
        return self._sync.run(self.astep(action))

    async def astep(self, action: Generation | Sequence[int] | np.ndarray) -> StepResult:
        """Take the policy's turn and answer it.

        Returns:
            (observation, reward, terminated, truncated, info): the observation
            is the tool result's token ids (empty when the episode ended without
            one); the reward is non-zero only when the episode ends; `info` has
            `turn`, and `tool`, `tool_ok`, `tool_result`, `result_truncated`
            after a call, and `finish_reason`, `reward`, `tool_calls` at the end.
            `tool_result` is True when the observation is a tool's output (an
            error the tool reported included) and False when it is the env's
            own message (a malformed call's error, the tool-call limit): a
            tree sampler branches only after real tool results.

        Raises:
            gymnasium.error.ResetNeeded: Before `reset` or after the episode ended.
            ValueError: The action is not a flat sequence of integer token ids
                in the vocabulary, or is longer than `remaining_tokens`
                (nothing changes).
            agentenv.errors.ToolError: A tool's infrastructure failed.
        """
        self._check_can_step()
        ids, logprobs, entropies, finish = self._as_turn(action)
        versions = list(action.versions) if isinstance(action, Generation) and action.versions is not None else None
        self._state_keys.append(self.state_key())  # the state this turn acts from
        self._append(Segment("policy", ids, logprobs, entropies, versions))
        self._turns += 1
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if self._turns == 1:  # the first turn continues the task's prefill, if any
            text = self._response_prefix + text
        parsed = self._format.parse(text)
        eos = finish == "eos" or (bool(ids) and self._eos_id is not None and ids[-1] == self._eos_id)

        if parsed.kind == "answer":
            return await self._finish("answer", terminated=True)
        if eos and not (self._format.eos_ends_turn and parsed.kind in ("call", "malformed")):
            return await self._finish("eos", terminated=True)
        if self.remaining_tokens <= 0:
            return await self._finish("context", truncated=True)
        if parsed.kind == "none":
            return await self._finish("length", truncated=True)
        if self.remaining_tokens < self._format.min_result_tokens:
            # No result could be shown: do not run the call.
            return await self._finish("context", truncated=True)

        info: dict[str, Any] = {"turn": self._turns}
        made = await self._answer_call(parsed, info)
        if made is None:
            return await self._finish("tool_limit", truncated=True)
        budget = min(self.config.max_result_tokens, self.remaining_tokens)
        messages = self._messages
        shown = await frame_off_loop(made, lambda: self._format.result(messages, ids, parsed, made, budget))
        obs = shown.token_ids
        if not obs:
            return await self._finish("context", truncated=True)
        self._messages = shown.messages
        self._append(Segment("tool", obs))
        self._calls.append({"segment": len(self._segments) - 1, "tool": info.get("tool"), "ok": info.get("tool_ok"),
                            "kind": info.get("tool_error_kind")})
        self._format.check(self._messages, self._segments)
        info["result_truncated"] = shown.cut
        if self.remaining_tokens <= 0:
            return await self._finish("context", truncated=True, obs=obs, info=info)
        return StepResult(as_token_array(obs), 0.0, False, False, info)

    async def _answer_call(self, parsed: ParsedTurn, info: dict[str, Any]) -> str | None:
        """The text the model reads for a call or malformed call; None ends the episode."""
        if parsed.kind == "malformed":
            self._count("invalid")
            info.update(tool="invalid", tool_ok=False, tool_result=False)
            return f"Error: {parsed.error}"
        assert parsed.tool is not None and parsed.query is not None
        used = sum(v for k, v in self._tool_calls.items() if k != "invalid")
        if used >= self.config.max_tool_calls:
            self._count("invalid")
            if self._limit_warned:
                return None
            self._limit_warned = True
            info.update(tool="invalid", tool_ok=False, tool_result=False)
            return (
                f"Tool-call limit reached: {used} of {self.config.max_tool_calls} calls used. "
                "Do not call tools anymore; give your final answer now in <answer>...</answer>."
            )
        try:
            result, elapsed = await call_tool(self._tools[parsed.tool], parsed.query, self.config.tool_timeout_s)
        except ToolError as e:  # the infrastructure failed: the trajectory fails, and the tool's tally says so
            self._count(parsed.tool)
            self._count_error(parsed.tool, "error", str(e))
            raise
        self._count(parsed.tool)
        self._tool_time_s += elapsed
        self._tool_time_by_name[parsed.tool] = self._tool_time_by_name.get(parsed.tool, 0.0) + elapsed
        info.update(tool=parsed.tool, tool_ok=result.ok, tool_result=True)
        if not result.ok:
            kind = result.kind or "error"
            self._count_error(parsed.tool, kind, result.error or "")
            info["tool_error_kind"] = kind
        return result_text(result)

    def _count_error(self, tool: str, kind: str, text: str) -> None:
        errors = self._tool_errors.setdefault(tool, {})
        errors[kind] = errors.get(kind, 0) + 1
        self._tool_error_text.setdefault(f"{tool}/{kind}", text[:200])

    async def _finish(
        self,
        reason: str,
        *,
        terminated: bool = False,
        truncated: bool = False,
        obs: list[int] | None = None,
        info: dict[str, Any] | None = None,
    ) -> StepResult:
        self._done = True
        self._finish_reason = reason
        await self._score()
        out = dict(info or {})
        out.update(
            turn=self._turns,
            finish_reason=reason,
            reward=dict(self._reward_info),
            tool_calls=dict(self._tool_calls),
        )
        return StepResult(as_token_array(obs or []), self._reward, terminated, truncated, out)

    async def _score(self) -> None:
        """The episode's reward, through the gate (`agentenv.tasks.rewards.RewardGate`).

        Raises:
            RewardError: The score is no finite number in the reward's range: the trajectory fails, counted by kind.
        """
        assert self._task is not None
        from agentenv.tasks.rewards import RewardError, RewardGate, arpo_reward

        gate = RewardGate(self._reward_fn or arpo_reward, self.config.reward_timeout_s)
        try:
            r = await gate.score(self.policy_text(), self._task, dict(self._tool_calls))
        except RewardError as e:
            self._reward, self._reward_info = 0.0, {"score": 0.0, "correct": False, "format_ok": False, "error": e.kind}
            raise
        self._reward = r.score
        self._reward_info = {"score": self._reward, "correct": r.correct, "format_ok": r.format_ok}
        if r.error is not None:
            self._reward_info["error"] = r.error

    def policy_text(self) -> PolicyText:
        """What the policy wrote this episode: its turns, each decoded alone, as a `PolicyText`.

        Tool results are left out, so nothing a tool prints (an `<answer>`, a
        stray `</result>`) can earn or spoil a reward. Each turn stays its own
        text (`PolicyText.turns`; as a string, one per line): the built-in
        rewards check every turn's tags alone, so no tag and no answer can form
        across a turn boundary. A prefill the task's messages end with is the
        start of the first turn.
        """
        turns = [self.tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in self._segments if s.source == "policy"]
        turns = turns or [""]
        turns[0] = self._response_prefix + turns[0]
        return PolicyText(turns)

    def _count(self, key: str) -> None:
        self._tool_calls[key] = self._tool_calls.get(key, 0) + 1

    def _append(self, seg: Segment) -> None:
        self._segments.append(seg)
        self._context.extend(seg.token_ids)
        self._context_hash.update(seg.token_ids)

    def _check_can_step(self) -> None:
        if not self._started:
            raise ResetNeeded(f"{type(self).__name__}.step was called before reset(); call env.reset(...) first")
        if self._done:
            raise ResetNeeded(
                f"{type(self).__name__}.step was called after the episode ended "
                f"(finish_reason={self._finish_reason!r}); call env.reset(...) to start a new one"
            )
        if not self._tools and self._prototypes:
            raise ResetNeeded(f"{type(self).__name__}: the episode's tools were closed; call env.reset(...)")

    def _as_turn(self, action: Any) -> tuple[list[int], list[float], list[float], str | None]:
        """The turn's ids, logprobs, entropies and finish reason; a malformed action raises before anything changes."""
        if isinstance(action, Generation):
            ids = action_ids(np.asarray(action.token_ids) if action.token_ids else [], self._vocab_size)
            lps, ents, finish = list(action.logprobs), list(action.entropies), action.finish_reason
        else:
            ids = action_ids(action, self._vocab_size)
            lps, ents, finish = [math.nan] * len(ids), [math.nan] * len(ids), None
        if len(ids) > self.remaining_tokens:
            raise ValueError(
                f"the action has {len(ids)} tokens but only {self.remaining_tokens} remain of the context budget "
                f"(env.max_context_tokens={self.config.max_context_tokens}); generate at most env.remaining_tokens"
            )
        return ids, lps, ents, finish

    # ---- records, forks, closing ----------------------------------------

    def trajectory(self) -> Trajectory:
        """The episode so far as a `Trajectory` (segments are copies)."""
        return Trajectory(
            task_id=self._task.id if self._task is not None else "",
            segments=[_copy_segment(s) for s in self._segments],
            reward=self._reward,
            finish_reason=self._finish_reason,
            tool_calls=dict(self._tool_calls),
            tool_errors={name: dict(kinds) for name, kinds in self._tool_errors.items()},
            tool_time_s=self._tool_time_s,
            uid=self._uid,
            parent_uid=self._parent_uid,
            branch_token=self._branch_token,
            state_keys=list(self._state_keys),
            info={
                "turns": self._turns,
                "reward": dict(self._reward_info),
                "tool_time_by_name": dict(self._tool_time_by_name),
                "tool_error_text": dict(self._tool_error_text),
                "calls": [dict(c) for c in self._calls],
            },
        )

    def fork(self) -> AgentEnv:
        """An independent copy of the episode: context, segments, counters, and forked tools.

        The copy's trajectory records this one as its parent and the current
        context length as its branch point. Before `reset`, returns a fresh env
        over the same prototypes.
        """
        new = copy.copy(self)
        new._sync = SyncRunner(type(self).__name__, "astep")
        new._closed = False
        new._owns_tools = False  # the prototypes stay with the original
        new.observation_space = copy.deepcopy(self.observation_space)
        new.action_space = copy.deepcopy(self.action_space)
        new._np_random = copy.deepcopy(self._np_random)
        if not self._started:
            new._clear_episode()
            return new
        new._context = list(self._context)
        new._context_hash = self._context_hash.copy()
        new._state_keys = list(self._state_keys)
        new._segments = [_copy_segment(s) for s in self._segments]
        new._messages = list(self._messages)
        new._tool_calls = dict(self._tool_calls)
        new._tool_time_by_name = dict(self._tool_time_by_name)
        new._tool_errors = {name: dict(kinds) for name, kinds in self._tool_errors.items()}
        new._tool_error_text = dict(self._tool_error_text)
        new._calls = [dict(c) for c in self._calls]
        new._reward_info = dict(self._reward_info)
        new._tools = {name: tool.fork() for name, tool in self._tools.items()}
        new._uid = uuid.uuid4().hex[:12]
        new._parent_uid = self._uid
        new._branch_token = len(self._context)
        return new

    async def aclose(self) -> None:
        """Close the episode's tools (not the prototypes). The env can be reset again."""
        tools, self._tools = self._tools, {}
        await self._aclose_tools(tools)

    async def _aclose_tools(self, tools: Mapping[str, Tool]) -> None:
        """Close every tool (one failing to close does not keep the others open); raise the first error."""
        errors = []
        for name, tool in tools.items():
            if tool is not self._prototypes.get(name):
                try:
                    await close_tool(tool, self.config.tool_timeout_s)
                except Exception as e:  # noqa: BLE001 - re-raised below, after the others are closed
                    errors.append(e)
        if errors:
            raise errors[0]

    def _discard_tools(self, tools: Mapping[str, Tool]) -> None:
        if tools:
            self._sync.run_or_schedule(self._aclose_tools(dict(tools)))

    def close(self) -> None:
        """Close the episode's tools, the prototypes if owned, and the env's own loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tools, self._tools = self._tools, {}

        async def _close_all() -> None:
            await self._aclose_tools(tools)
            if self._owns_tools:
                for proto in self._prototypes.values():
                    await close_tool(proto, self.config.tool_timeout_s)

        self._sync.run_or_schedule(_close_all())
        self._sync.close()
        super().close()


def _copy_segment(s: Segment) -> Segment:
    return Segment(
        s.source,
        list(s.token_ids),
        None if s.logprobs is None else list(s.logprobs),
        None if s.entropies is None else list(s.entropies),
        None if s.versions is None else list(s.versions),
    )
