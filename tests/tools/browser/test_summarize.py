"""Summarizers: an OpenAI-compatible endpoint (served locally), prompt and cleanup helpers."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web

from agentenv.errors import ToolError
from agentenv.tools.browser import BrowserTool, EndpointSummarizer
from agentenv.tools.browser.summarize import NOTHING_RELEVANT, clean_summary, summary_request


def test_summary_request_holds_goal_page_and_instructions():
    msg = summary_request("launch code", "Archive", "http://x/", "The code is 7731.")
    assert "Goal: launch code" in msg and "URL: http://x/" in msg and "The code is 7731." in msg
    assert NOTHING_RELEVANT in msg
    assert "Summarize the main content" in summary_request("", "", "http://x/", "text")


def test_clean_summary_drops_reasoning():
    assert clean_summary("<think>let me see</think>\n The code is 7731. ") == "The code is 7731."
    assert clean_summary("<think>never closed") == ""


@pytest.fixture
async def chat_server():
    """A fake OpenAI-compatible server that answers with the passage's line mentioning the goal's last word."""
    seen: list[dict] = []

    async def completions(request):
        body = await request.json()
        seen.append({"body": body, "auth": request.headers.get("Authorization")})
        if body["model"] == "broken":
            return web.json_response({"error": "no such model"}, status=404)
        user = body["messages"][-1]["content"]
        goal_word = user.split("\n", 1)[0].split()[-1].strip("?").lower()
        hits = [s for s in user.split("\n") if goal_word in s.lower() and not s.startswith(("Goal:", "Write down"))]
        return web.json_response({"choices": [{"message": {"content": "<think>hmm</think>" + " ".join(hits)}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", seen
    await runner.cleanup()


async def test_endpoint_summarizer_end_to_end(site, cfg, chat_server, monkeypatch):
    url, seen = chat_server
    monkeypatch.setenv("TEST_SUMMARY_KEY", "k123")
    summ = EndpointSummarizer(url, model="m", api_key_env="TEST_SUMMARY_KEY", max_tokens=64)
    tool = BrowserTool(cfg, summarizer=summ)
    r = await tool(f"{site.url('/deep')} | what is the Zephyr launch code")
    assert r.ok, r.error
    assert r.metadata["summarized"] is True
    assert site.needle in r.text and "<think>" not in r.text
    assert "River" not in r.text.split("\n\n", 1)[1]  # the summary, not the passage
    body = seen[0]["body"]
    assert body["max_tokens"] == 64 and body["model"] == "m" and seen[0]["auth"] == "Bearer k123"
    await tool.aclose()
    await summ.aclose()


async def test_endpoint_failure_is_a_tool_error(site, cfg, chat_server):
    url, _ = chat_server
    for summ, match in (
        (EndpointSummarizer(url, model="broken"), "HTTP 404"),
        (EndpointSummarizer("http://127.0.0.1:9/v1", model="m"), "unreachable"),
    ):
        tool = BrowserTool(cfg, summarizer=summ)
        with pytest.raises(ToolError, match=match):
            await tool(site.url("/article") + " | height")
        await tool.aclose()
        await summ.aclose()


def test_summarizer_type_is_checked(cfg):
    with pytest.raises(TypeError, match="Summarizer or a Policy"):
        BrowserTool(cfg, summarizer="gpt")
