"""Parse one policy turn for a tool call in ARPO's tag format.

The model calls a tool by writing `<name>query</name>`, where `name` is the
tool's `Tool.name` (so a new tool brings its own tag), and answers with
`<answer>...</answer>`. `<think>` and `<result>` are reserved: free reasoning
and the env's own tool results.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

RESERVED_TAGS = ("think", "answer", "result")

TurnKind = Literal["call", "answer", "none", "malformed"]

# `<tag>` or `</tag>`; tag names like Python identifiers, plus `-` and `.`.
_TAG_RE = re.compile(r"<(/?)([A-Za-z_][\w.\-]*)>")


@dataclass(frozen=True)
class ParsedTurn:
    """What one turn asks of the env.

    Attributes:
        kind: `call` (a complete tool call), `answer` (a complete
            `<answer>...</answer>`), `none` (neither) or `malformed`.
        tool: The called tool's name (`call`), or the offending tag
            (`malformed`, when there is one).
        query: The call's query, stripped (`call`).
        answer: The answer's inner text, stripped (`answer`).
        error: For `malformed`: a reason the model can read and act on.
        end: Character index just after the closing tag of the call or answer
            (0 otherwise).
    """

    kind: TurnKind
    tool: str | None = None
    query: str | None = None
    answer: str | None = None
    error: str | None = None
    end: int = 0


def _tool_list(tool_names: Iterable[str]) -> str:
    names = [f"<{n}>" for n in tool_names]
    return ", ".join(names) if names else "none (answer with <answer>...</answer>)"


def parse_turn(text: str, tool_names: Iterable[str]) -> ParsedTurn:
    """Find what a turn asks for: the first complete tool call or answer.

    The first closing tag of a tool or of `answer` that has a matching opening
    tag before it wins (the policy stops at the first closing tag anyway); its
    content runs from the nearest such opening tag, so a tag merely mentioned
    earlier in the text does not swallow the call. Only when the turn holds no
    complete call or answer are problems reported, in this order: a pair of
    unknown tags (`<foo>...</foo>`), a tool or answer tag left open, a closing
    tag with no opening.

    Args:
        text: The decoded turn.
        tool_names: The names (= tags) of the env's tools.

    Returns:
        The parsed turn; never raises on the text's content.
    """
    tools = tuple(tool_names)
    actionable = set(tools) | {"answer"}
    opened: dict[str, int] = {}  # tag -> end index of its most recent opening
    open_start: dict[str, int] = {}
    first_unknown: str | None = None
    first_unopened: str | None = None
    for m in _TAG_RE.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if not closing:
            opened[tag] = m.end()
            open_start[tag] = m.start()
            continue
        if tag not in opened:
            if tag in actionable and first_unopened is None:
                first_unopened = tag
            continue
        inner = text[opened.pop(tag) : m.start()]
        open_start.pop(tag)
        if tag == "answer":
            return ParsedTurn("answer", answer=inner.strip(), end=m.end())
        if tag in tools:
            query = inner.strip()
            if not query:
                return ParsedTurn(
                    "malformed",
                    tool=tag,
                    error=f"Empty query: <{tag}></{tag}> holds nothing. Put the query between the tags.",
                    end=m.end(),
                )
            return ParsedTurn("call", tool=tag, query=query, end=m.end())
        if tag not in RESERVED_TAGS and first_unknown is None:
            first_unknown = tag

    if first_unknown is not None:
        return ParsedTurn(
            "malformed",
            tool=first_unknown,
            error=f"Unknown tag <{first_unknown}>. Available tools: {_tool_list(tools)}.",
        )
    unclosed = sorted((pos, tag) for tag, pos in open_start.items() if tag in actionable)
    if unclosed:
        tag = unclosed[0][1]
        return ParsedTurn(
            "malformed",
            tool=tag,
            error=f"Unclosed tag: <{tag}> was opened but not closed. Close it with </{tag}>.",
        )
    if first_unopened is not None:
        tag = first_unopened
        return ParsedTurn(
            "malformed",
            tool=tag,
            error=f"Unopened tag: </{tag}> has no matching <{tag}> before it. Write <{tag}>...</{tag}>.",
        )
    return ParsedTurn("none")
