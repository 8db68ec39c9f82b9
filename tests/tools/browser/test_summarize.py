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
    assert clean_summary("template opened it</think>\nThe code is 7731.") == "The code is 7731."


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


# --------------------------------------------------------------------------- PolicySummarizer
# A real Policy (ScriptedPolicy) over the offline test tokenizer (ChatML): its "model" reads the
# prompt it is given and answers with the sentences that mention "code", so the test sees
# exactly what reached the model.


def _reader(tok, seen: list[str]):
    def turn(prompt_ids: list[int]) -> str:
        prompt = tok.decode(prompt_ids)
        seen.append(prompt)
        page = prompt.split("Page content:\n", 1)[1].split("\n\nWrite down", 1)[0]
        hits = [s.strip() for s in page.replace("\n", " ").split(". ") if "code" in s]
        return "<think>scan the page</think> " + ". ".join(hits)

    return turn


async def test_policy_summarizer_through_the_tool(site, cfg):
    from agentenv.envs.testing import build_test_tokenizer
    from agentenv.policies.scripted import ScriptedPolicy

    tok = build_test_tokenizer()
    seen: list[str] = []
    policy = ScriptedPolicy(tok, _reader(tok, seen))
    tool = BrowserTool(cfg, summarizer=policy)  # a Policy is wrapped with the config's budgets
    r = await tool(f"{site.url('/deep')} | Zephyr launch code")
    await tool.aclose()
    assert r.ok and r.metadata["summarized"] is True
    summary = r.text.split("\n\n", 1)[1]
    assert "7731-ALPHA" in summary and "<think>" not in summary
    prompt = seen[0]
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "Goal: Zephyr launch code" in prompt and site.needle in prompt


async def test_policy_summarizer_budgets():
    import copy

    from agentenv.envs.testing import build_test_tokenizer
    from agentenv.policies.scripted import ScriptedPolicy
    from agentenv.tools.browser import PolicySummarizer

    tok = build_test_tokenizer()
    passage = "The launch code is 7731. " + "Filler words about rivers and harbors. " * 400
    summ = PolicySummarizer(ScriptedPolicy(tok, lambda ids: "x"), max_tokens=32, input_tokens=100)
    full = len(summ.prompt_ids("goal", "t", "http://x/", passage))
    frame = len(summ.prompt_ids("goal", "t", "http://x/", ""))
    assert 100 <= full - frame <= 110  # the passage was cut to input_tokens (plus " ...")
    # A tokenizer that knows the model's context cuts further so that prompt + summary fit.
    small = copy.deepcopy(tok)
    small.model_max_length = frame + 32 + 60
    summ = PolicySummarizer(ScriptedPolicy(small, lambda ids: "x"), max_tokens=32, input_tokens=1000)
    assert len(summ.prompt_ids("goal", "t", "http://x/", passage)) + 32 <= small.model_max_length
    small.model_max_length = frame + 32
    with pytest.raises(ToolError, match="no room"):
        summ.prompt_ids("goal", "t", "http://x/", passage)


async def test_policy_failure_is_a_tool_error(site, cfg):
    from agentenv.envs.testing import build_test_tokenizer
    from agentenv.policies.scripted import ScriptedPolicy

    def crash(ids):
        raise RuntimeError("CUDA out of memory")

    tool = BrowserTool(cfg, summarizer=ScriptedPolicy(build_test_tokenizer(), crash))
    with pytest.raises(ToolError, match="summarizer model failed .*CUDA out of memory"):
        await tool(site.url("/article"))
    await tool.aclose()
