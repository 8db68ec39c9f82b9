"""Tool results as tokens: the one place both envs format, truncate and call tools.

A result is encoded in three pieces, the template's prefix, the tool's text and
the template's suffix, so truncating the text is a cut of its token ids (no
decode-and-re-encode) and the text can never inject special tokens such as EOS:
the template may hold special tokens, the tool's text is encoded with
`split_special_tokens=True`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agentenv.envs.toolloop import run_on_tool_loop
from agentenv.errors import ConfigError, ToolError
from agentenv.loader import check_number
from agentenv.tools.base import Tool
from agentenv.types import ToolResult

DEFAULT_RESULT_TEMPLATE = "<result>\n{text}\n</result>"
DEFAULT_TRUNCATION_MARKER = "\n...[truncated]"


def validate_result_fields(
    prefix: str, template: str, marker: str, max_result_tokens: int, tool_timeout_s: float
) -> None:
    """Checks shared by `AgentEnvConfig` and `ToolEnvConfig` (keys named `prefix.field`)."""
    if template.count("{text}") != 1:
        raise ConfigError(f"{prefix}.result_template", f"must contain '{{text}}' exactly once, got {template!r}")
    if not isinstance(marker, str):
        raise ConfigError(f"{prefix}.truncation_marker", f"must be a string, got {marker!r}")
    check_number(f"{prefix}.max_result_tokens", max_result_tokens, low=1, low_ok=True, integer=True)
    check_number(f"{prefix}.tool_timeout_s", tool_timeout_s)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of plain text: no added special tokens, special-token strings split.

    Falls back to a plain encode for tokenizers without `split_special_tokens`.
    """
    if not text:
        return []
    try:
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    except TypeError:
        return list(tokenizer.encode(text, add_special_tokens=False))


@dataclass
class ResultFormatter:
    """Turns a result text into token ids that fit a budget.

    Attributes:
        tokenizer: The policy's tokenizer.
        template: Holds `{text}` once; e.g. `<result>\\n{text}\\n</result>`.
        marker: Appended to a cut text, e.g. `\\n...[truncated]`.
    """

    tokenizer: Any
    template: str = DEFAULT_RESULT_TEMPLATE
    marker: str = DEFAULT_TRUNCATION_MARKER

    def __post_init__(self) -> None:
        head, _, tail = self.template.partition("{text}")
        # The template's own text may hold special tokens on purpose (a chat turn).
        self._head = list(self.tokenizer.encode(head, add_special_tokens=False)) if head else []
        self._tail = list(self.tokenizer.encode(tail, add_special_tokens=False)) if tail else []
        self._marker = encode_text(self.tokenizer, self.marker)

    @property
    def min_tokens(self) -> int:
        """Tokens of the smallest result (empty text cut to nothing, with the marker)."""
        return len(self._head) + len(self._tail) + len(self._marker)

    def encode(self, text: str, budget: int) -> tuple[list[int], bool]:
        """Encode a result within `budget` tokens.

        Args:
            text: What the model should read.
            budget: Most tokens the whole result may take.

        Returns:
            (token ids, whether the text was cut). When even the empty template
            plus the marker exceeds the budget, returns ([], True).
        """
        body = encode_text(self.tokenizer, text)
        frame = len(self._head) + len(self._tail)
        if frame + len(body) <= budget:
            return self._head + body + self._tail, False
        keep = budget - frame - len(self._marker)
        if keep < 0:
            return [], True
        return self._head + body[:keep] + self._marker + self._tail, True


def result_text(result: ToolResult) -> str:
    """What the model reads from a result: its text, else its error."""
    if result.text:
        return result.text
    if not result.ok:
        return f"Error: {result.error or 'the tool call failed'}"
    return ""


async def call_tool(tool: Tool, query: str, timeout_s: float) -> tuple[ToolResult, float]:
    """Call a tool with a timeout; a timeout becomes a result the model reads.

    The call runs on the tool loop (`agentenv.envs.toolloop`): a tool that
    blocks its thread still times out on time and holds up no generation.
    `ToolError` (infrastructure; also a tool raising a stray `CancelledError`)
    and any other exception propagate.

    Returns:
        (result, wall seconds spent).
    """
    t0 = time.perf_counter()
    try:
        result = await run_on_tool_loop(lambda: tool(query), timeout_s, f"the {tool.name} tool")
    except TimeoutError:
        elapsed = time.perf_counter() - t0
        msg = f"The {tool.name} call timed out after {timeout_s:g} s. Try a simpler or shorter request."
        return ToolResult(text=f"Error: {msg}", ok=False, error="timeout", latency_s=elapsed), elapsed
    elapsed = time.perf_counter() - t0
    if not isinstance(result, ToolResult):
        raise TypeError(f"tool {tool.name!r} returned {type(result).__name__}, expected agentenv.types.ToolResult")
    return result, elapsed


async def close_tool(tool: Tool, timeout_s: float) -> None:
    """`tool.aclose()` on the tool loop (where its calls made their resources), bounded in time.

    Raises:
        ToolError: Closing took longer than `timeout_s`, or the tool raised one.
    """
    try:
        await run_on_tool_loop(tool.aclose, timeout_s, f"the {tool.name} tool")
    except TimeoutError:
        raise ToolError(f"closing the {tool.name} tool took longer than {timeout_s:g} s; its resources may leak") from None
