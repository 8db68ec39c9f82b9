"""The endpoint reached in-process (`LocalTransport`, the client `AgentRunner` gives its agents) answers every
request as it does over HTTP: the same statuses, error bodies, headers and counts, the same recording.

Each case is sent twice to one real endpoint on 127.0.0.1, over HTTP (httpx2, as
the `openai` client sends it) and in-process, each to an episode of its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest

from agentenv.envs.chat import ChatTemplate
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout.endpoint.agent import agent_http_client
from agentenv.rollout.endpoint.config import EndpointConfig
from agentenv.rollout.endpoint.server import Endpoint, LocalTransport
from agentenv.types import SamplingParams

PARAMS = SamplingParams(max_tokens=400, temperature=1.0)
BODY = {"model": "agentenv", "messages": [{"role": "user", "content": "hi"}]}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.fixture
def chat(tok):
    return ChatTemplate.from_config(tok, "chatml_hermes", {})


def post(body: Any, **headers: str) -> tuple[str, str, dict[str, str], bytes]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return "POST", "/v1/chat/completions", {"Content-Type": "application/json", **headers}, content


# name -> (key -> (method, path, extra headers, body)); "{key}" in a header is the episode's key
CASES: dict[str, Callable[[], tuple[str, str, dict[str, str], bytes]]] = {
    "answered": lambda: post(BODY | {"tools": TOOLS}),
    "streamed": lambda: post(BODY | {"stream": True, "stream_options": {"include_usage": True}}),
    "models": lambda: ("GET", "/v1/models", {}, b""),
    "episode": lambda: ("GET", "/v1/agentenv/episode", {}, b""),
    "no key": lambda: post(BODY, Authorization=""),
    "unknown key": lambda: post(BODY, Authorization="Bearer ae-nobody"),
    "ended key": lambda: post(BODY, Authorization="Bearer {ended}"),
    "over the cap": lambda: post(BODY, Authorization="Bearer {capped}"),
    "other model": lambda: post(BODY | {"model": "gpt-4"}),
    "unknown route": lambda: ("POST", "/v1/completions", {}, b"{}"),
    "wrong method": lambda: ("GET", "/v1/chat/completions", {}, b""),
    "too large": lambda: post(BODY | {"messages": [{"role": "user", "content": "x" * 5000}]}),
    "charset": lambda: post(BODY, **{"Content-Type": "application/json; charset=latin-1"}),
    "not JSON": lambda: post(b'{"model": '),
    "not UTF-8": lambda: post(b'{"model": "agentenv", "messages": [{"role": "user", "content": "\xff"}]}'),
    "lone surrogate": lambda: post(b'{"model": "agentenv", "messages": [{"role": "user", "content": "\\ud800"}]}'),
    "deep JSON": lambda: post(b'{"model": "agentenv", "messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"),
    "bad parameter": lambda: post(BODY | {"stream": "yes"}),
    "bad messages": lambda: post(BODY | {"messages": [{"role": "wizard", "content": "hi"}]}),
}


def comparable(r: httpx2.Response) -> tuple[Any, ...]:
    """What must be the same over both paths: status, headers that carry meaning, the body less its fresh ids."""
    kind = r.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        body: Any = [{k: v for k, v in e.items() if k not in ("id", "created", "agentenv")} for e in events]
        body.append(r.text.rstrip().endswith("data: [DONE]"))
    elif r.content:
        body = r.json()
        for k in ("id", "created", "agentenv", "episode"):
            body.pop(k, None)
        for t in body.get("trajectories", []):
            t.pop("uid")
        for c in body.get("choices", []):
            for call in c["message"].get("tool_calls") or []:
                call.pop("id")
    else:
        body = None
    return r.status_code, kind, r.headers.get("x-should-retry"), "x-agentenv-trajectory" in r.headers, body


@pytest.mark.parametrize("case", list(CASES))
async def test_in_process_requests_are_answered_and_counted_as_over_http(tok, chat, case):
    ep = await Endpoint(chat, EndpointConfig(max_request_bytes=4096, max_requests_per_episode=1), 4096).start()
    policy = ScriptedPolicy(tok, lambda ids: "Let me add. " + CALL)
    answers = []
    try:
        for http in (httpx2.AsyncClient(), httpx2.AsyncClient(transport=LocalTransport(ep))):
            rec = ep.open_episode(policy, PARAMS, seed=0)
            ended = ep.open_episode(policy, PARAMS, seed=1)
            ep.close_episode(ended.key)
            capped = ep.open_episode(policy, PARAMS, seed=2)
            capped.admitted = 1  # its one request made
            method, path, headers, content = CASES[case]()
            headers = {"Authorization": f"Bearer {rec.key}"} | headers
            headers = {k: v.format(ended=ended.key, capped=capped.key) for k, v in headers.items()}
            before = ep.counts.copy()
            async with http:
                r = await http.request(method, ep.url.removesuffix("/v1") + path, headers=headers, content=content)
            answers.append((comparable(r), ep.counts - before, len(rec.threads), rec.requests))
    finally:
        await ep.aclose()
    over_http, in_process = answers
    assert in_process == over_http
    status, kind, _, _, body = over_http[0]
    assert kind.startswith("text/event-stream" if case == "streamed" else "application/json")
    if status >= 400:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert sum(over_http[1].values()) == 1 and over_http[2:] == (0, 0)  # one error counted, nothing recorded
    elif case in ("answered", "streamed"):
        assert over_http[1:] == ({"requests": 1}, 1, 1)


class Hangs(ScriptedPolicy):
    """Hangs until cancelled (then says so)."""

    def __init__(self, tok):
        super().__init__(tok, ["never"])
        self.hung = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def generate(self, prompt_ids, params):
        self.hung.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


async def test_the_clients_read_timeout_holds_in_process_and_cancels_the_generation(tok, chat):
    ep = await Endpoint(chat, EndpointConfig(), 4096).start()
    policy = Hangs(tok)
    rec = ep.open_episode(policy, PARAMS, seed=0)
    http = agent_http_client(ep)
    client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0, http_client=http, timeout=0.5)
    try:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="agentenv", messages=BODY["messages"])
        await asyncio.wait_for(policy.cancelled.wait(), 10)
    finally:
        await http.close_pool()
        await ep.aclose()
    assert rec.requests == 0 and rec.threads == [] and sum(ep.counts.values()) == 0


async def test_another_url_goes_over_http(tok, chat):
    """A client of the runner's pool pointed elsewhere (another endpoint here) is served there, over HTTP."""
    ep, other = [await Endpoint(chat, EndpointConfig(), 4096).start() for _ in range(2)]
    rec = other.open_episode(ScriptedPolicy(tok, ["elsewhere"]), PARAMS, seed=0)
    http = agent_http_client(ep)
    client = openai.AsyncOpenAI(base_url=other.url, api_key=rec.key, max_retries=0, http_client=http)
    try:
        r = await client.chat.completions.create(model="agentenv", messages=BODY["messages"])
    finally:
        await http.close_pool()
        await ep.aclose()
        await other.aclose()
    assert r.choices[0].message.content == "elsewhere"
    assert other.counts["requests"] == 1 and rec.requests == 1 and not ep.counts
