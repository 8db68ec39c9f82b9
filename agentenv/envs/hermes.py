"""`hermes`: tool calls as JSON in `<tool_call>` tags, results as `tool` turns of the model's chat template.

The policy calls a tool by writing, anywhere in its turn,

    <tool_call>
    {"name": "search", "arguments": {"query": "capital of France"}}
    </tool_call>

(one call per turn: generation stops at `</tool_call>`). The chat template gets
the tools' JSON schemas as `tools` (`agentenv.tools.base.tool_schema`) and
renders each result as a `{"role": "tool", ...}` message. The final answer is
the paper's: `<answer>...</answer>` (with `\\boxed{}` for ARPO's reward) in a
plain assistant turn; the episode also ends when a turn without a call ends
with EOS. So every built-in reward works in both formats, and it reads only
what the policy wrote (never a tool turn).

Turns are rendered incrementally: the policy's tokens stay as sampled, and the
env appends the template's text from the end of the policy's turn (after the
EOS it emitted, or in its place) to where the next assistant turn begins,
tokenized whole. Then it checks that rendering the whole conversation from
scratch gives the same context (`agentenv.envs.chat.check_from_scratch`), and
raises a ConfigError naming the template when it does not (a template that
rewrites earlier turns, such as one that drops past reasoning).

Results are framed, cut and protected from special-token injection as in
every format (`agentenv.envs.results.ResultFormatter.frame`).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from agentenv.envs.chat import ChatTemplate, check_from_scratch
from agentenv.envs.formats import Messages, RenderedResult
from agentenv.envs.parsing import ParsedTurn
from agentenv.envs.results import ResultFormatter
from agentenv.errors import ConfigError
from agentenv.tasks.prompts import is_prefilled
from agentenv.tools.base import query_from_arguments, tool_schema
from agentenv.types import Segment, Tokenizer

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_TAG_RE = re.compile(r"<(/?)(tool_call|answer)>")
_SENTINEL = "\ue000agentenv-result\ue001"  # private-use characters: no template or tool writes them
_warned: set[str] = set()


def _example(tools: Mapping[str, Any]) -> str:
    name = next(iter(tools), "search")
    params = (tool_schema(tools[name])["function"]["parameters"].get("properties") or {}) if tools else {}
    args = {k: "..." for k in params} or {"query": "..."}
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': args})}\n{CALL_CLOSE}"


def _malformed(error: str, tool: str | None = None, end: int = 0) -> ParsedTurn:
    return ParsedTurn("malformed", tool=tool, error=error, end=end)


def _loads(text: str) -> Any:
    """`json.loads`, every way it can fail a `ValueError` whose message the model can read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{e.msg}: line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as e:  # an integer past Python's limit on digits, ...
        raise ValueError(str(e).split(";")[0][:200]) from None


def parse_call(inner: str, tools: Mapping[str, Any], end: int) -> ParsedTurn:
    """The call inside one `<tool_call>...</tool_call>`; every mistake is a malformed turn the model reads.

    Never raises on the text: JSON that cannot be read (invalid, nested past
    the recursion limit, an integer past Python's limit on digits) is a
    malformed call like any other.
    """
    try:
        return _parse_call(inner, tools, end)
    except RecursionError:  # arguments too deep to handle even after json read them
        return _malformed(f"The tool call is nested too deeply to read. Write {_example(tools)}", end=end)


def _parse_call(inner: str, tools: Mapping[str, Any], end: int) -> ParsedTurn:
    how = f"Write {_example(tools)}"
    try:
        obj = _loads(inner)
    except ValueError as e:
        return _malformed(f"The tool call is not valid JSON ({e}). {how}", end=end)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return _malformed(f'A tool call is a JSON object with a "name" and its "arguments". {how}', end=end)
    name = obj["name"]
    if name not in tools:
        known = ", ".join(tools) or "none (answer with <answer>...</answer>)"
        return _malformed(f"Unknown tool {name!r}. Available tools: {known}.", tool=name, end=end)
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = _loads(args)
        except ValueError:
            pass
    if not isinstance(args, dict):
        return _malformed(f'"arguments" must be a JSON object, got {json.dumps(args)[:80]}. {how}', tool=name, end=end)
    try:
        query = query_from_arguments(tools[name], args)
    except ValueError as e:
        return _malformed(f"{e}. {how}", tool=name, end=end)
    if not query.strip():
        return _malformed(f"Empty {name} call: its arguments hold nothing. {how}", tool=name, end=end)
    return ParsedTurn("call", tool=name, query=query, end=end)


def parse_hermes(text: str, tools: Mapping[str, Any]) -> ParsedTurn:
    """The first complete tool call or answer of a turn (whichever closes first), else what is wrong.

    Args:
        text: The decoded turn.
        tools: The env's tools by name (their schemas map arguments to the query).
    """
    opened: dict[str, int] = {}
    for m in _TAG_RE.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if not closing:
            opened[tag] = m.end()  # the nearest opening before a closing wins
            continue
        if tag not in opened:
            continue
        inner = text[opened.pop(tag) : m.start()]
        if tag == "answer":
            return ParsedTurn("answer", answer=inner.strip(), end=m.end())
        return parse_call(inner, tools, m.end())
    if "tool_call" in opened:
        return _malformed(f"Unclosed {CALL_OPEN}: end the JSON call with {CALL_CLOSE}. Write {_example(tools)}")
    return ParsedTurn("none")


class HermesFormat:
    """The `hermes` tool-call format (see the module docstring)."""

    def bind(self, tokenizer: Tokenizer, config: Any, tools: Mapping[str, Any]) -> HermesTurns:
        return HermesTurns(tokenizer, config, tools)


class HermesTurns:
    """`HermesFormat` bound to an env: its template, tools and tokenizer."""

    eos_ends_turn = True
    stop_strings = (CALL_CLOSE, "</answer>")

    def __init__(self, tokenizer: Tokenizer, config: Any, tools: Mapping[str, Any]):
        self.chat = ChatTemplate.from_config(tokenizer, config.chat_template, config.chat_template_kwargs)
        if not self.chat.available:
            raise ConfigError(
                "env.chat_template",
                f"the hermes format renders results as tool turns of a chat template, and {self.chat.name} has "
                "none: set env.chat_template (e.g. chatml_hermes, or a Jinja file)",
            )
        self.tools = dict(tools)
        self.chat.tools = [tool_schema(t) for t in self.tools.values()] or None
        if self.chat.ignores_tools() and self.chat.name not in _warned:
            _warned.add(self.chat.name)
            warnings.warn(
                f"{self.chat.name} ignores `tools`: the model is not shown the tools' schemas; describe them in "
                "the system prompt, or use a template with tool support (env.chat_template: chatml_hermes)",
                stacklevel=2,
            )
        self.eos_id: int | None = tokenizer.eos_token_id
        self.formatter = ResultFormatter(tokenizer, "{text}", config.truncation_marker)
        head, tail, _ = self._frame([{"role": "user", "content": "?"}], "!", None)
        self.min_result_tokens = len(self.chat.encode(head + config.truncation_marker + tail))

    # ---- pieces ----------------------------------------------------------
    def _frame(self, messages: Messages, turn_text: str, tool: str | None) -> tuple[str, str, Messages]:
        """(head, tail, messages with the turn and a tool placeholder): the template's text around a result.

        `turn_text` is the policy's turn with an EOS it emitted; the assistant
        message holds it without that EOS, which the template writes itself
        (after the prefill the turn continued, if the conversation ends with one).
        """
        prefix = self.chat.render(messages, add_generation_prompt=True)
        base, prefill = (messages[:-1], messages[-1]["content"]) if is_prefilled(messages) else (messages, "")
        content = turn_text
        eos_text = self.chat.decode([self.eos_id]) if self.eos_id is not None else None
        if eos_text and content.endswith(eos_text):
            content = content[: -len(eos_text)]
        tool_msg: dict[str, Any] = {"role": "tool", "content": _SENTINEL}
        if tool is not None:
            tool_msg["name"] = tool
        convo = [*base, {"role": "assistant", "content": prefill + content}, tool_msg]
        rendered = self.chat.render(convo, add_generation_prompt=True)
        start = prefix + turn_text
        if not rendered.startswith(start):
            at = next((i for i, (a, b) in enumerate(zip(start, rendered)) if a != b), min(len(start), len(rendered)))
            raise ConfigError(
                "env.chat_template",
                f"{self.chat.name} does not render the policy's turn as it was written, so a tool turn cannot "
                f"follow it token-exactly: at character {at} the context has {start[max(0, at - 40):at + 40]!r}, "
                f"the template {rendered[max(0, at - 40):at + 40]!r}",
            )
        delta = rendered[len(start) :]
        if delta.count(_SENTINEL) != 1:
            raise ConfigError(
                "env.chat_template", f"{self.chat.name} does not render a tool message's content verbatim (once)"
            )
        head, tail = delta.split(_SENTINEL)
        return head, tail, convo

    # ---- the BoundFormat API ---------------------------------------------
    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> tuple[Messages, list[int]]:
        msgs = [dict(m) for m in messages]
        return msgs, self.chat.encode(self.chat.render(msgs, add_generation_prompt=True))

    def parse(self, text: str) -> ParsedTurn:
        return parse_hermes(text, self.tools)

    def result(
        self, messages: Messages, turn_ids: list[int], parsed: ParsedTurn, text: str, budget: int
    ) -> RenderedResult:
        tool = parsed.tool if parsed.tool in self.tools else None
        head, tail, convo = self._frame(messages, self.chat.decode(turn_ids), tool)
        ids, shown, cut = self.formatter.frame(head, text, tail, budget)
        if not ids:
            return RenderedResult([], messages, True)
        convo[-1] = {**convo[-1], "content": shown}
        return RenderedResult(ids, convo, cut)

    def check(self, messages: Messages, segments: Sequence[Segment]) -> None:
        check_from_scratch(self.chat, segments, self.chat.render(messages, add_generation_prompt=True))
