"""ToolEnv: one Tool as a gymnasium environment, in tokens.

Action: the query as token ids. Observation: the formatted result as token ids
(same template and truncation as `AgentEnv`). There is no task and no reward;
an episode is a session with the tool, truncated after `max_calls` calls.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from gymnasium.error import ResetNeeded

from agentenv.envs.episode import Observation, StepResult
from agentenv.envs.results import (
    DEFAULT_RESULT_TEMPLATE,
    DEFAULT_TRUNCATION_MARKER,
    ResultFormatter,
    call_tool,
    close_tool,
    frame_off_loop,
    result_text,
    validate_result_fields,
)
from agentenv.envs.spaces import TokenSequence, action_ids, as_token_array
from agentenv.envs.sync import SyncRunner
from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.tools.base import Tool
from agentenv.types import Tokenizer


@dataclass(frozen=True)
class ToolEnvConfig:
    """Limits and format of a `ToolEnv` session.

    Attributes:
        max_calls: Calls per episode; the call that reaches it truncates the episode.
        max_result_tokens: Most tokens of one formatted result; longer ones are cut and marked.
        tool_timeout_s: Wall-clock limit of one call; a timeout becomes a result.
        result_template: How a result is shown; holds `{text}` once.
        truncation_marker: Appended to a result text that was cut.
    """

    max_calls: int = 5
    max_result_tokens: int = 512
    tool_timeout_s: float = 60.0
    result_template: str = DEFAULT_RESULT_TEMPLATE
    truncation_marker: str = DEFAULT_TRUNCATION_MARKER

    def __post_init__(self) -> None:
        if not isinstance(self.max_calls, int) or self.max_calls < 1:
            raise ConfigError("tool_env.max_calls", f"must be an int >= 1, got {self.max_calls!r}")
        validate_result_fields(
            "tool_env", self.result_template, self.truncation_marker, self.max_result_tokens, self.tool_timeout_s
        )


class ToolEnv(gymnasium.Env):
    """One tool as an env: query token ids in, result token ids out.

    `reset` forks the prototype tool into the episode's own tool (a fresh
    session for stateful tools) and returns an empty observation. Each `step`
    calls it once. Reward is always 0; `terminated` is never set; `truncated`
    is set by the call that reaches `max_calls`.

    Args:
        tool: The prototype tool.
        tokenizer: The policy's tokenizer.
        config: `ToolEnvConfig` or a mapping of its fields.
        owns_tool: Close the prototype in `close()` (set by the registry's
            factories, which built it).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        tool: Tool,
        tokenizer: Tokenizer,
        config: ToolEnvConfig | Mapping[str, Any] | None = None,
        *,
        owns_tool: bool = False,
    ):
        self.config = build_dataclass(ToolEnvConfig, config, "tool_env")
        self.tool = tool
        self.tokenizer = tokenizer
        self._owns_tool = owns_tool
        self._formatter = ResultFormatter(tokenizer, self.config.result_template, self.config.truncation_marker)
        self._vocab_size = len(tokenizer)
        self.observation_space = TokenSequence(self._vocab_size)
        self.action_space = TokenSequence(self._vocab_size)
        self._sync = SyncRunner(type(self).__name__, "astep")
        self._episode_tool: Tool | None = None
        self._started = False
        self._calls = 0
        self._tool_time_s = 0.0

    @property
    def calls(self) -> int:
        return self._calls

    @property
    def tool_time_s(self) -> float:
        return self._tool_time_s

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Start a session with a fresh fork of the tool. Returns (empty int64 array, {"tool": name})."""
        super().reset(seed=seed)
        if self._episode_tool is not None and self._episode_tool is not self.tool:
            self._sync.run_or_schedule(close_tool(self._episode_tool, self.config.tool_timeout_s))
        self._episode_tool = self.tool.fork()
        self._started = True
        self._calls = 0
        self._tool_time_s = 0.0
        return as_token_array([]), {"tool": self.tool.name}

    def step(self, action: Sequence[int] | np.ndarray) -> StepResult:
        """Synchronous `astep`, on the env's own loop (raises inside a running loop)."""
        return self._sync.run(self.astep(action))

    async def astep(self, action: Sequence[int] | np.ndarray) -> StepResult:
        """Call the tool with the decoded query.

        Returns:
            (result token ids, 0.0, False, truncated, info with `ok`, `error`,
            `calls`, `result_truncated`, and `tool_result` True: every
            observation is the tool's output, as in `AgentEnv`).
        """
        if not self._started or self._episode_tool is None:
            raise ResetNeeded(f"{type(self).__name__}.step was called before reset(); call env.reset() first")
        if self._calls >= self.config.max_calls:
            raise ResetNeeded(
                f"{type(self).__name__}: the episode ended after max_calls={self.config.max_calls}; call env.reset()"
            )
        ids = action_ids(action, self._vocab_size)
        query = self.tokenizer.decode(ids, skip_special_tokens=True)
        result, elapsed = await call_tool(self._episode_tool, query, self.config.tool_timeout_s)
        self._calls += 1
        self._tool_time_s += elapsed
        text = result_text(result)
        obs, cut = await frame_off_loop(text, lambda: self._formatter.encode(text, self.config.max_result_tokens))
        truncated = self._calls >= self.config.max_calls
        info = {"ok": result.ok, "error": result.error, "calls": self._calls, "result_truncated": cut, "tool_result": True}
        return StepResult(as_token_array(obs), 0.0, False, truncated, info)

    def fork(self) -> ToolEnv:
        """An independent copy: counters copied, the episode's tool forked."""
        new = copy.copy(self)
        new._sync = SyncRunner(type(self).__name__, "astep")
        new._np_random = copy.deepcopy(self._np_random)
        new.observation_space = copy.deepcopy(self.observation_space)
        new.action_space = copy.deepcopy(self.action_space)
        new._owns_tool = False
        if self._episode_tool is not None:
            new._episode_tool = self._episode_tool.fork()
        return new

    async def aclose(self) -> None:
        """Close the episode's tool (not the prototype)."""
        tool, self._episode_tool = self._episode_tool, None
        self._started = False
        if tool is not None and tool is not self.tool:
            await close_tool(tool, self.config.tool_timeout_s)

    def close(self) -> None:
        """Close the episode's tool, the prototype if owned, and the env's loop. Idempotent."""
        tool, self._episode_tool = self._episode_tool, None
        self._started = False
        owned, self._owns_tool = (self.tool if self._owns_tool else None), False

        async def _close() -> None:
            if tool is not None and tool is not self.tool:
                await close_tool(tool, self.config.tool_timeout_s)
            if owned is not None:
                await close_tool(owned, self.config.tool_timeout_s)

        self._sync.run_or_schedule(_close())
        self._sync.close()
        super().close()
