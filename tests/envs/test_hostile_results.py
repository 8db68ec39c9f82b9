"""Tool text an attacker controls (a search answer, a page, a program's output) cannot fail or stall an episode.

Every result passes through `ResultFormatter.frame`: lone surrogates and NULs
become U+FFFD before anything tokenizes them, a text is cut by characters to a
bound derived from its token budget before it is tokenized, and a long result
is framed in a worker thread, off the event loop.
"""

from __future__ import annotations

import threading
import time

import pytest

from agentenv.envs import AgentEnv, ToolEnv
from agentenv.envs.results import LARGE_RESULT_CHARS, MAX_CHARS_PER_TOKEN, ResultFormatter
from agentenv.types import ToolResult

FORMATS = {"tags": {"tool_format": "tags"}, "hermes": {"tool_format": "hermes", "chat_template": "chatml_hermes"}}
CALL = {"tags": "<search>q</search>", "hermes": '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'}


class TextTool:
    """A search tool that answers every query with `text`."""

    name = "search"

    def __init__(self, text: str):
        self.text = text

    async def __call__(self, query: str) -> ToolResult:
        return ToolResult(text=self.text)

    def fork(self) -> TextTool:
        return self

    async def aclose(self) -> None:
        return None


def first_result(tok, enc, task, fmt: str, text: str, **config):
    env = AgentEnv([TextTool(text)], tok, config={**FORMATS[fmt], **config})
    env.reset(options={"task": task})
    obs, _, term, trunc, info = env.step(enc(CALL[fmt]))
    assert not (term or trunc) and info["tool"] == "search", info
    return env, tok.decode(obs), info


@pytest.mark.parametrize("fmt", FORMATS)
def test_lone_surrogates_and_nuls_are_replaced_not_fatal(tok, task, enc, fmt):
    # `"abc \ud800"` raised TypeError (TextEncodeInput) in astep: the episode failed
    env, shown, _ = first_result(tok, enc, task, fmt, "abc \ud800 def \udc80\x00 end \ud83d\ude00")
    assert "abc \ufffd def \ufffd\ufffd end \U0001f600" in shown  # a pair that makes a character is kept


def test_tool_env_replaces_them_too(tok, enc):
    env = ToolEnv(TextTool("x \udfff y\x00"), tok)
    env.reset()
    obs, *_ = env.step(enc("q"))
    assert tok.decode(obs) == "<result>\nx \ufffd y\ufffd\n</result>"


def test_a_huge_text_is_cut_by_characters_before_it_is_tokenized(tok, monkeypatch):
    seen: list[int] = []
    encode = tok.encode

    def spy(text, *args, **kwargs):
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tok, "encode", spy)
    budget = 200
    t0 = time.perf_counter()
    ids, cut = ResultFormatter(tok).encode("the capital of Norvex is Quenby. " * 400_000, budget)  # 13 MB
    assert cut and len(ids) <= budget and tok.decode(ids).endswith("...[truncated]\n</result>")
    assert max(seen) <= budget * MAX_CHARS_PER_TOKEN + 100, max(seen)  # the whole 13 MB was tokenized
    assert time.perf_counter() - t0 < 5.0
    # a text cut by characters alone (its tokens would fit) is still marked as cut
    long_tokens = "=" * (budget * MAX_CHARS_PER_TOKEN + 1)
    ids, cut = ResultFormatter(tok).encode(long_tokens, 10 * budget)
    assert cut and tok.decode(ids).endswith("...[truncated]\n</result>")


def _spying(result, threads: list[threading.Thread]):
    """`result`, noting the thread of each call in `threads`."""

    def spy(*args, **kwargs):
        threads.append(threading.current_thread())
        return result(*args, **kwargs)

    return spy


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_large_result_is_framed_off_the_event_loop(tok, task, enc, fmt):
    big, small = "Quenby is the capital. " * 50_000, "Quenby is the capital."
    assert len(big) > LARGE_RESULT_CHARS > len(small)
    for text, off_loop in ((big, True), (small, False)):
        env = AgentEnv([TextTool(text)], tok, config={**FORMATS[fmt], "max_result_tokens": 200})
        env.reset(options={"task": task})
        threads: list[threading.Thread] = []
        env._format.result = _spying(env._format.result, threads)
        obs, _, term, _, info = await env.astep(enc(CALL[fmt]))
        assert not term and len(obs) <= 200 and info["result_truncated"] == off_loop
        assert (threads[0] is not threading.current_thread()) == off_loop, (len(text), threads)
        await env.aclose()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_12_mb_result_takes_a_step_of_no_time(tok, task, enc, fmt):
    t0 = time.perf_counter()
    _, shown, info = first_result(tok, enc, task, fmt, "word " * 2_500_000, max_result_tokens=512)
    assert info["result_truncated"] and "...[truncated]" in shown
    assert time.perf_counter() - t0 < 5.0  # 47-91 s when the whole text was tokenized first
