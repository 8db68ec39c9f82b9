"""Tool-call formats by name (`env.tool_format`): how the policy writes a call and reads its result.

A format binds to an env's tokenizer, config and tools (`ToolFormat.bind`) and
then renders the prompt, parses each policy turn into a `ParsedTurn`, says
where generation stops, encodes a tool result as the tokens the policy reads
next, and checks that the context equals a rendering from scratch
(`agentenv.envs.chat.check_from_scratch`). Results are appended as tokens, so
every format is token-exact by construction. Built in:

- `tags`: ARPO's. `<search>query</search>` calls, results in
  `<result>...</result>` inside the same assistant turn, `<answer>...</answer>`.
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` calls,
  results as `tool` turns of the chat template, which gets the tools' JSON
  schemas as `tools` (`agentenv.envs.hermes`).

Register another with `register_tool_format("name", obj_or_"module:attr")`,
name it as `module:attr`, or ship it in the `agentenv.tool_formats` entry-point group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentenv.envs.chat import ChatTemplate, check_from_scratch
from agentenv.envs.parsing import ParsedTurn, parse_turn
from agentenv.envs.results import ResultFormatter
from agentenv.errors import ConfigError
from agentenv.registry import Registry
from agentenv.types import Segment, Tokenizer

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class RenderedResult:
    """A tool result as the policy reads it.

    Attributes:
        token_ids: What the env appends (empty: not even a cut result fits the budget).
        messages: The conversation after the turn and its result, as chat messages.
        cut: The result's text was truncated to fit.
    """

    token_ids: list[int]
    messages: Messages
    cut: bool


class BoundFormat(Protocol):
    """A format bound to one env's tokenizer, config and tools.

    Attributes:
        stop_strings: Where a policy turn ends (pass as `SamplingParams.stop`).
        eos_ends_turn: EOS closes the assistant turn, not the episode: a call
            followed by EOS is still answered (hermes). False: EOS ends the episode (tags).
        min_result_tokens: Fewest tokens any result takes (the env does not run
            a call it has no room to answer).
    """

    stop_strings: tuple[str, ...]
    eos_ends_turn: bool
    min_result_tokens: int

    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> tuple[Messages, list[int]]:
        """The episode's chat messages and its prompt token ids (ending where the policy writes)."""
        ...

    def parse(self, text: str) -> ParsedTurn:
        """What the turn asks for: a call, an answer, nothing, or a malformed call (never raises on the text)."""
        ...

    def result(
        self, messages: Messages, turn_ids: list[int], parsed: ParsedTurn, text: str, budget: int
    ) -> RenderedResult:
        """The tokens that follow the policy's turn `turn_ids` when its call is answered with `text`."""
        ...

    def check(self, messages: Messages, segments: Sequence[Segment]) -> None:
        """Raise ConfigError (naming the template) when the context is not a from-scratch rendering's prefix."""
        ...


@runtime_checkable
class ToolFormat(Protocol):
    """A tool-call format: `bind(tokenizer, config, tools)` gives the env its `BoundFormat`."""

    def bind(self, tokenizer: Tokenizer, config: Any, tools: Mapping[str, Any]) -> BoundFormat: ...


# --------------------------------------------------------------------------- tags (ARPO)
class TagFormat:
    """ARPO's tags: `<name>query</name>` calls, `<answer>...</answer>`, results in `env.result_template`.

    The whole response is one open assistant turn: the prompt is rendered with
    the chat template, everything after it is the policy's text and the results.
    """

    def result_formatter(self, tokenizer: Tokenizer, template: str, marker: str) -> ResultFormatter:
        """How a result's text becomes tokens (override to show results differently)."""
        return ResultFormatter(tokenizer, template, marker)

    def bind(self, tokenizer: Tokenizer, config: Any, tools: Mapping[str, Any]) -> TagTurns:
        return TagTurns(self, tokenizer, config, tools)


class TagTurns:
    """`TagFormat` bound to an env."""

    eos_ends_turn = False

    def __init__(self, fmt: TagFormat, tokenizer: Tokenizer, config: Any, tools: Mapping[str, Any]):
        self.chat = ChatTemplate.from_config(tokenizer, config.chat_template, config.chat_template_kwargs)
        self.tool_names = tuple(tools)
        self.stop_strings = tuple(f"</{name}>" for name in self.tool_names) + ("</answer>",)
        self.formatter = fmt.result_formatter(tokenizer, config.result_template, config.truncation_marker)
        self.min_result_tokens = self.formatter.min_tokens

    def _prompt_text(self, messages: Sequence[Mapping[str, Any]]) -> str:
        from agentenv.tasks.prompts import render_prompt_text

        return render_prompt_text(self.chat.tokenizer, messages, self.chat.template, **self.chat.kwargs)

    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> tuple[Messages, list[int]]:
        msgs = [dict(m) for m in messages]
        return msgs, self.chat.encode(self._prompt_text(msgs))

    def parse(self, text: str) -> ParsedTurn:
        return parse_turn(text, self.tool_names)

    def result(
        self, messages: Messages, turn_ids: list[int], parsed: ParsedTurn, text: str, budget: int
    ) -> RenderedResult:
        ids, cut = self.formatter.encode(text, budget)
        return RenderedResult(ids, messages, cut)

    def check(self, messages: Messages, segments: Sequence[Segment]) -> None:
        # From scratch: the prompt as the template renders it, then the response as one text.
        rest = [t for s in segments[1:] for t in s.token_ids]
        check_from_scratch(self.chat, segments, self._prompt_text(messages) + self.chat.decode(rest))


# --------------------------------------------------------------------------- the registry
def _check(obj: Any, key: str) -> ToolFormat:
    fmt = obj() if isinstance(obj, type) else obj
    if not isinstance(fmt, ToolFormat):
        raise ConfigError(key, f"{obj!r} is not a tool-call format: it needs bind(tokenizer, config, tools)")
    return fmt


TOOL_FORMATS: Registry[ToolFormat] = Registry(
    "tool-call format", "env.tool_format", group="agentenv.tool_formats", adapt=_check
)


def register_tool_format(name: str, fmt: Any, *, overwrite: bool = False) -> None:
    """Register a format (an object or class with `bind`, or `"module:attr"`)."""
    TOOL_FORMATS.register(name, fmt, overwrite=overwrite)


register_tool_format("tags", TagFormat)
register_tool_format("hermes", "agentenv.envs.hermes:HermesFormat")
