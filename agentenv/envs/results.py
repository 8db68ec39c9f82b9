"""Tool results as tokens: the one place every env and format encodes, truncates and calls tools.

A result is framed text: the template's head, the tool's text, the template's
tail (`<result>\n{text}\n</result>`, or the chat template's text around a
tool turn). The frame is tokenized whole, as the same text tokenizes from
scratch (tokenizing the pieces apart could merge differently at their seams),
and a text too long for its budget is cut in text space, at a token boundary of
the text alone, before the marker is added. The template may hold special
tokens; the tool's text cannot inject any: a special-token string in it is
broken by a zero-width space (U+200B) after its first character.

Every result passes through `ResultFormatter.frame`, which first makes the
text safe to tokenize, whatever a tool returned: a text longer than
`MAX_CHARS_PER_TOKEN` characters per token of its budget is cut by characters
before anything tokenizes it (so a 12 MB answer costs what a budget's worth
does), and lone surrogates and NUL characters become U+FFFD (a tokenizer
cannot encode a lone surrogate; `agentenv.types.clean_text`, which every
`ToolResult` applies to its text as it is made). A result longer than
`LARGE_RESULT_CHARS` is framed in a worker thread (`frame_off_loop`), so other
trajectories keep going while it tokenizes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentenv.envs.toolloop import run_on_tool_loop
from agentenv.errors import ConfigError, ToolError
from agentenv.loader import check_number
from agentenv.tools.base import Tool
from agentenv.types import Tokenizer, ToolResult, clean_text

DEFAULT_RESULT_TEMPLATE = "<result>\n{text}\n</result>"
DEFAULT_TRUNCATION_MARKER = "\n...[truncated]"
MAX_CHARS_PER_TOKEN = 16
"""A result's text is cut to `budget * MAX_CHARS_PER_TOKEN` characters before it is tokenized.

Generous: English runs about 4 characters a token, code about 3; only a text of
unusually long tokens (long runs of one character) is cut, and marked, before
its token budget is full."""
LARGE_RESULT_CHARS = 32_768
"""Results longer than this are tokenized in a worker thread (`frame_off_loop`), not on the event loop."""


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


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of plain text: no added special tokens, special-token strings split.

    Falls back to a plain encode for tokenizers without `split_special_tokens`.
    """
    if not text:
        return []
    try:
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    except TypeError:
        return list(tokenizer.encode(text, add_special_tokens=False))


ZWSP = "\u200b"


def special_strings(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's special-token strings (longest first), which a tool's text must not spell."""
    specials = set(tokenizer.all_special_tokens)
    for added in tokenizer.added_tokens_decoder.values():
        if getattr(added, "special", False):
            specials.add(added.content)
    return sorted((s for s in specials if len(s) > 1), key=len, reverse=True)


def defuse(text: str, specials: list[str]) -> str:
    """`text` with every special-token string broken by a zero-width space after its first character."""
    for s in specials:
        if s in text:
            text = text.replace(s, s[0] + ZWSP + s[1:])
    return text


@dataclass
class ResultFormatter:
    """Turns a result text into token ids that fit a budget.

    Attributes:
        tokenizer: The policy's tokenizer.
        template: Holds `{text}` once; e.g. `<result>\\n{text}\\n</result>`.
        marker: Appended to a cut text, e.g. `\\n...[truncated]`.
    """

    tokenizer: Tokenizer
    template: str = DEFAULT_RESULT_TEMPLATE
    marker: str = DEFAULT_TRUNCATION_MARKER

    def __post_init__(self) -> None:
        self._head, _, self._tail = self.template.partition("{text}")
        self._specials = special_strings(self.tokenizer)

    @property
    def min_tokens(self) -> int:
        """Tokens of the smallest result (empty text cut to nothing, with the marker)."""
        return len(self._encode(self._head + self.marker + self._tail))

    def _encode(self, text: str) -> list[int]:
        # Template text: its special tokens are honored (the tool's text has none left).
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def encode(self, text: str, budget: int) -> tuple[list[int], bool]:
        """Encode a result within `budget` tokens.

        Args:
            text: What the model should read.
            budget: Most tokens the whole result may take.

        Returns:
            (token ids, whether the text was cut). When even the empty template
            plus the marker exceeds the budget, returns ([], True).
        """
        ids, _, cut = self.frame(self._head, text, self._tail, budget)
        return ids, cut

    def frame(self, head: str, text: str, tail: str, budget: int) -> tuple[list[int], str, bool]:
        """`head + text + tail` tokenized whole within `budget` tokens, the text cut (and marked) if need be.

        The text is cut to `budget * MAX_CHARS_PER_TOKEN` characters first, then
        cleaned (`clean_text`) and defused, so nothing longer is ever tokenized.

        Returns:
            (token ids, the text as shown (cleaned, defused, maybe cut and
            marked), whether it was cut). ([], "", True) when not even an empty
            cut result fits.
        """
        limit = max(budget, 0) * MAX_CHARS_PER_TOKEN
        cut_chars = len(text) > limit
        shown = defuse(clean_text(text[:limit] if cut_chars else text), self._specials)
        ids = self._encode(head + shown + tail)
        if len(ids) <= budget and not cut_chars:
            return ids, shown, False
        # `shown` holds no special-token string (defused): encoding it plainly gives the ids of a split
        # encode, and leaves the tokenizer's settings alone (this may run in a worker thread).
        body = self._encode(shown)
        keep = budget - (len(ids) - len(body)) - len(self._encode(self.marker))
        for _ in range(8):  # a cut may tokenize a little differently at its seams: shrink until it fits
            if keep < 0:
                break
            shown = self.tokenizer.decode(body[:keep], clean_up_tokenization_spaces=False) + self.marker
            ids = self._encode(head + shown + tail)
            if len(ids) <= budget:
                return ids, shown, True
            keep = min(keep - 1, keep - (len(ids) - budget))
        return [], "", True


async def frame_off_loop(text: str, render: Callable[[], Any]) -> Any:
    """`render()`, which frames the result `text`: in a worker thread when the text is long.

    Tokenizing a long result takes a while; off the event loop it holds up no
    other trajectory's generation or tool call. A short one is framed in place.
    """
    if len(text) > LARGE_RESULT_CHARS:
        return await asyncio.to_thread(render)
    return render()


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
        return ToolResult(text=f"Error: {msg}", ok=False, error="timeout", latency_s=elapsed, kind="timeout"), elapsed
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
