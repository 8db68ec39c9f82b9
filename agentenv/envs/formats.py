"""Tool-call formats by name (`env.tool_format`): how the policy writes a call and reads its result.

A format turns a policy turn into a `ParsedTurn`, says where generation stops
(the strings that close a call or an answer), and encodes a tool result as the
tokens the policy reads next. Built in: `tags`, ARPO's (`<search>query</search>`,
results in `<result>...</result>`). Register another with
`register_tool_format("name", obj_or_"module:attr")`, name it as `module:attr`,
or ship it in the `agentenv.tool_formats` entry-point group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from agentenv.envs.parsing import ParsedTurn, parse_turn
from agentenv.envs.results import ResultFormatter
from agentenv.errors import ConfigError
from agentenv.registry import Registry


@runtime_checkable
class ToolFormat(Protocol):
    """How calls and results are written; all three are token-exact by construction (results are appended as tokens)."""

    def parse(self, text: str, tool_names: Iterable[str]) -> ParsedTurn:
        """What the turn asks for: a call, an answer, nothing, or a malformed call."""
        ...

    def stop_strings(self, tool_names: Iterable[str]) -> tuple[str, ...]:
        """The strings that end a turn (the closing of a call or of the answer)."""
        ...

    def result_formatter(self, tokenizer: Any, template: str, marker: str) -> ResultFormatter:
        """Encodes a result text into the tokens the policy reads, within a budget."""
        ...


class TagFormat:
    """ARPO's tags: `<name>query</name>` calls, `<answer>...</answer>`, results in `env.result_template`."""

    def parse(self, text: str, tool_names: Iterable[str]) -> ParsedTurn:
        return parse_turn(text, tool_names)

    def stop_strings(self, tool_names: Iterable[str]) -> tuple[str, ...]:
        return tuple(f"</{name}>" for name in tool_names) + ("</answer>",)

    def result_formatter(self, tokenizer: Any, template: str, marker: str) -> ResultFormatter:
        return ResultFormatter(tokenizer, template, marker)


def _check(obj: Any, key: str) -> ToolFormat:
    fmt = obj() if isinstance(obj, type) else obj
    if not isinstance(fmt, ToolFormat):
        raise ConfigError(key, f"{obj!r} is not a tool-call format: it needs parse, stop_strings and result_formatter")
    return fmt


TOOL_FORMATS: Registry[ToolFormat] = Registry(
    "tool-call format", "env.tool_format", group="agentenv.tool_formats", adapt=_check
)


def register_tool_format(name: str, fmt: Any, *, overwrite: bool = False) -> None:
    """Register a format (an object or class with `parse`, `stop_strings`, `result_formatter`, or `"module:attr"`)."""
    TOOL_FORMATS.register(name, fmt, overwrite=overwrite)


register_tool_format("tags", TagFormat)
