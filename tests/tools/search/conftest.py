"""A scriptable search provider on 127.0.0.1 that speaks Bing v7 or SearXNG JSON."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web


def bing_payload(n: int, prefix: str = "r") -> dict:
    return {
        "_type": "SearchResponse",
        "queryContext": {"originalQuery": "q"},
        "webPages": {
            "totalEstimatedMatches": n,
            "value": [
                {"name": f"{prefix}{i} title", "url": f"https://ex.org/{prefix}{i}", "snippet": f"{prefix}{i} snippet"}
                for i in range(n)
            ],
        },
    }


def searxng_payload(n: int) -> dict:
    return {
        "query": "q",
        "number_of_results": n,
        "results": [
            {"title": f"s{i} title", "url": f"https://ex.org/s{i}", "content": f"s{i} content", "engine": "x"}
            for i in range(n)
        ],
    }


def ok(payload):
    async def h(request):
        return web.json_response(payload)

    return h


def status(code: int, headers: dict | None = None, body: str = "{}"):
    async def h(request):
        return web.Response(status=code, headers=headers or {}, text=body, content_type="application/json")

    return h


def raw(body: str):
    async def h(request):
        return web.Response(status=200, text=body, content_type="application/json")

    return h


def hang(seconds: float):
    async def h(request):
        await asyncio.sleep(seconds)
        return web.json_response({})

    return h


def delayed(seconds: float, payload):
    async def h(request):
        await asyncio.sleep(seconds)
        return web.json_response(payload)

    return h


class FakeProvider:
    """Answers request i with `script[i]` (the last entry repeats); records every request."""

    def __init__(self):
        self.script = [ok({})]
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.url = ""

    # Behaviours and payloads, reachable from tests through the fixture
    # (--import-mode=importlib keeps tests from importing this conftest).
    ok = staticmethod(ok)
    status = staticmethod(status)
    raw = staticmethod(raw)
    hang = staticmethod(hang)
    delayed = staticmethod(delayed)
    bing_payload = staticmethod(bing_payload)
    searxng_payload = staticmethod(searxng_payload)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        i = len(self.requests)
        self.requests.append({"path": request.path, "query": dict(request.query), "headers": dict(request.headers)})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self.script[min(i, len(self.script) - 1)](request)
        finally:
            self.in_flight -= 1


@pytest.fixture
async def provider():
    fake = FakeProvider()
    app = web.Application()
    app.router.add_get("/v7.0/search", fake.handle)
    app.router.add_get("/search", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    await runner.cleanup()

