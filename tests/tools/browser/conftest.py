"""A local aiohttp site (127.0.0.1 only) with every kind of page the browser must survive."""

from __future__ import annotations

import asyncio
import random
import socket
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from agentenv.tools.browser import BrowserConfig

NEEDLE = "The Zephyr observatory's launch code is 7731-ALPHA, as the director confirmed in 1987."
FILLER_WORDS = "river mountain city history music people market season forest harbor bridge village".split()

ARTICLE = """<!doctype html><html><head><meta charset="utf-8"><title>Eiffel Tower - Encyclopedia</title></head>
<body><nav><a href="/">Home</a> | <a href="/about">About</a> | <a href="/login">Log in</a></nav>
<article><h1>Eiffel Tower</h1>
<p>The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.</p>
<p>It is named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.</p>
<p>Construction was completed on 31 March 1889, in time for the 1889 World's Fair.</p>
<p>The tower is 330 metres tall, about the same height as an 81-storey building.</p>
</article>
<footer>Copyright 2024 Encyclopedia. All rights reserved. Cookie settings.</footer></body></html>"""

FRENCH = (
    "Le café de Zürich est très réputé. Les crêpes et la bière sont servies à l'intérieur. "
    "La façade naïve et le décor élégant attirent les touristes. Le propriétaire s'appelle René Lefèvre."
)


def filler(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(FILLER_WORDS) for _ in range(12)).capitalize() + "." for _ in range(n)]


def deep_page() -> str:
    """~250 kB of filler paragraphs with one relevant sentence near the end."""
    paras = filler(2000)
    paras.insert(1800, NEEDLE)
    body = "".join(f"<p>{p}</p>" for p in paras)
    return f"<html><head><title>Observatory archive</title></head><body><article>{body}</article></body></html>"


def tiny_pdf(text: str) -> bytes:
    """A one-page PDF showing `text` (hand-built: objects, xref table, trailer)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


@dataclass
class Site:
    """A running site: its base url, what it saw, and the texts tests look for."""

    base: str
    port: int
    hits: dict[str, int] = field(default_factory=dict)
    huge_sent: list[int] = field(default_factory=lambda: [0])
    huge_done: asyncio.Event = field(default_factory=asyncio.Event)
    needle: str = NEEDLE
    french: str = FRENCH

    def url(self, path: str) -> str:
        return self.base + path


def build_app(site: Site) -> web.Application:
    huge_size = 50 * 1024 * 1024
    chunk = ("<p>" + " ".join(filler(60, seed=1)) + "</p>\n").encode()

    @web.middleware
    async def count(request, handler):
        site.hits[request.path] = site.hits.get(request.path, 0) + 1
        return await handler(request)

    async def article(request):
        return web.Response(text=ARTICLE, content_type="text/html")

    async def huge(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        resp.content_length = huge_size
        await resp.prepare(request)
        await resp.write(b"<html><head><title>Huge</title></head><body><article>")
        sent = 0
        try:
            while sent < huge_size:
                await resp.write(chunk)
                sent += len(chunk)
                site.huge_sent[0] = sent
        except (ConnectionError, RuntimeError):
            pass  # the client hung up at its cap
        finally:
            site.huge_done.set()
        return resp

    async def stall(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        await resp.prepare(request)
        await resp.write(b"<html><body><p>Loading")
        await asyncio.sleep(3600)
        return resp

    async def trickle(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        await resp.prepare(request)
        try:
            while True:
                await resp.write(b"<p>.</p>")
                await asyncio.sleep(0.05)
        except (ConnectionError, RuntimeError):
            return resp

    async def loop_a(request):
        raise web.HTTPFound("/loop/b")

    async def loop_b(request):
        raise web.HTTPFound("/loop/a")

    async def chain(request):
        n = int(request.match_info["n"])
        raise web.HTTPFound(f"/chain/{n - 1}" if n > 1 else "/article")

    async def to_private(request):
        raise web.HTTPFound("http://10.0.0.1/admin")

    async def binary(request):
        return web.Response(body=random.Random(0).randbytes(20000), content_type="image/png")

    async def octet(request):
        return web.Response(body=random.Random(1).randbytes(20000), content_type="application/octet-stream")

    async def missing(request):
        raise web.HTTPNotFound(text="<html><body>Not here</body></html>", content_type="text/html")

    async def wrong_charset(request):
        # Declared UTF-8, sent cp1252: the strict decode fails and detection takes over.
        html = f"<html><head><title>Cafe</title></head><body><article><p>{FRENCH}</p><p>{FRENCH}</p></article></body></html>"
        return web.Response(body=html.encode("cp1252"), headers={"Content-Type": "text/html; charset=utf-8"})

    async def utf8_declared_latin1(request):
        html = f"<html><head><title>Cafe</title></head><body><article><p>{FRENCH}</p></article></body></html>"
        return web.Response(body=html.encode("utf-8"), headers={"Content-Type": "text/html; charset=iso-8859-1"})

    async def plain(request):
        return web.Response(text="Plain notes.\n" + NEEDLE + "\n", content_type="text/plain")

    async def deep(request):
        return web.Response(text=deep_page(), content_type="text/html")

    async def pdf(request):
        return web.Response(body=tiny_pdf("Annual report: revenue grew 42 percent in 2023."), content_type="application/pdf")

    async def searxng(request):
        # A SearXNG-style JSON answer whose results point back at this site.
        base = f"http://{request.host}"
        results = [
            {"title": "Zephyr observatory archive", "url": f"{base}/deep", "content": "An archive of filler."},
            {"title": "Gone page", "url": f"{base}/missing", "content": "Snippet of a page that is gone."},
            {"title": "Eiffel Tower", "url": f"{base}/article", "content": "The tower in Paris."},
            {"title": "Notes", "url": f"{base}/plain", "content": "Plain notes snippet."},
        ]
        return web.json_response({"query": request.query.get("q", ""), "results": results})

    app = web.Application(middlewares=[count])
    app.router.add_get("/search", searxng)
    app.router.add_get("/article", article)
    app.router.add_get("/huge", huge)
    app.router.add_get("/stall", stall)
    app.router.add_get("/trickle", trickle)
    app.router.add_get("/loop/a", loop_a)
    app.router.add_get("/loop/b", loop_b)
    app.router.add_get("/chain/{n}", chain)
    app.router.add_get("/to-private", to_private)
    app.router.add_get("/binary", binary)
    app.router.add_get("/octet", octet)
    app.router.add_get("/missing", missing)
    app.router.add_get("/wrong-charset", wrong_charset)
    app.router.add_get("/utf8-declared-latin1", utf8_declared_latin1)
    app.router.add_get("/plain", plain)
    app.router.add_get("/deep", deep)
    app.router.add_get("/report.pdf", pdf)
    return app


async def start_site(extra_routes=None) -> tuple[Site, web.AppRunner]:
    """Start the site on 127.0.0.1 (a free port); stop it with `await runner.cleanup()`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    site = Site(base=f"http://127.0.0.1:{port}", port=port)
    app = build_app(site)
    if extra_routes:
        extra_routes(app, site)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return site, runner


@pytest.fixture
async def site():
    """The site, started for one test."""
    s, runner = await start_site()
    yield s
    await runner.cleanup()


@pytest.fixture
def cfg() -> BrowserConfig:
    """Fast limits, and 127.0.0.1 allowed (the only host tests may reach)."""
    return BrowserConfig(
        allow_hosts=("127.0.0.1",), timeout_s=2.0, connect_timeout_s=1.0, read_timeout_s=0.5, max_bytes=1_000_000
    )
