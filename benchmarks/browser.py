"""Browser throughput: pages per second through fetch + select, 16 requests in flight.

A local aiohttp server (its own process, on 127.0.0.1) serves generated article
pages of about 30 kB (navigation, sidebar, 40 paragraphs, a table, a footer).
Each variant browses the same pages with a goal, no summarizer:

- `full`: trafilatura main-content extraction (the default for HTML up to 1 MB).
- `fast`: trafilatura's plain-text baseline (what pages over the cap get).
- `cached`: the same pages again from a warm SQLite page cache (no network).

    python benchmarks/browser.py [--pages 200] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing as mp
import random
import socket
import statistics
import tempfile
import time
from pathlib import Path

from agentenv.tools.browser import BrowserConfig, BrowserTool


def make_vocab(n: int, rng: random.Random) -> list[str]:
    letters = "etaoinshrdlucmfwypvbgk"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def article(i: int) -> tuple[str, str]:
    """(html, goal) of page i: a plausible article with boilerplate around it."""
    rng = random.Random(i)
    vocab = make_vocab(3000, random.Random(0))

    def sentence() -> str:
        return " ".join(rng.choice(vocab) for _ in range(rng.randint(8, 22))).capitalize() + "."

    nav = "".join(f'<li><a href="/section/{k}">{rng.choice(vocab)}</a></li>' for k in range(30))
    side = "".join(f'<li><a href="/page/{rng.randint(0, 10**6)}">{sentence()}</a></li>' for _ in range(25))
    paras = "".join(f"<p>{' '.join(sentence() for _ in range(rng.randint(3, 7)))}</p>" for _ in range(40))
    table = "".join(f"<tr><td>{rng.choice(vocab)}</td><td>{rng.randint(1, 9999)}</td></tr>" for _ in range(20))
    goal = " ".join(rng.sample(vocab[:500], 4))
    html = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Article {i}</title>"
        f"<style>{'.c{color:red}' * 200}</style><script>{'var x=1;' * 300}</script></head><body>"
        f"<header><nav><ul>{nav}</ul></nav></header><aside><ul>{side}</ul></aside>"
        f"<main><article><h1>Article {i}</h1>{paras}<table>{table}</table></article></main>"
        f"<footer>Copyright. Privacy. Terms. Cookie settings.</footer></body></html>"
    )
    return html, goal


def serve(port_q: mp.Queue, num_pages: int) -> None:
    from aiohttp import web

    pages = [article(i)[0].encode() for i in range(num_pages)]

    async def page(request):
        return web.Response(body=pages[int(request.match_info["i"])], content_type="text/html", charset="utf-8")

    async def main():
        app = web.Application()
        app.router.add_get("/page/{i}", page)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock, backlog=1024).start()
        port_q.put(sock.getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


async def run_variant(tool: BrowserTool, base: str, goals: list[str], concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        async with sem:
            t0 = time.perf_counter()
            r = await tool(f"{base}/page/{i} | {goals[i]}")
            lat.append(time.perf_counter() - t0)
            failed += not r.ok

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(len(goals))))
    wall = time.perf_counter() - t0
    lat.sort()
    return {
        "pages": len(goals),
        "failed": failed,
        "wall": wall,
        "pps": len(goals) / wall,
        "p50": statistics.median(lat),
        "p95": lat[int(0.95 * (len(lat) - 1))],
    }


async def bench(base: str, num_pages: int, concurrency: int) -> list[tuple[str, dict]]:
    goals = [article(i)[1] for i in range(num_pages)]
    cfg = BrowserConfig(allow_hosts=("127.0.0.1",), max_concurrency=concurrency)
    rows = []
    # Warm-up: imports, trafilatura's first-call setup, connection pool.
    warm = BrowserTool(cfg)
    await run_variant(warm, base, goals[:8], concurrency)
    await warm.aclose()
    for name, c in (("full", cfg), ("fast", dataclasses.replace(cfg, full_extraction_max_bytes=0))):
        tool = BrowserTool(c)
        rows.append((name, await run_variant(tool, base, goals, concurrency)))
        await tool.aclose()
    with tempfile.TemporaryDirectory() as d:
        c = dataclasses.replace(cfg, cache=str(Path(d) / "pages.sqlite"))
        tool = BrowserTool(c)
        await run_variant(tool, base, goals, concurrency)  # fill the cache
        rows.append(("cached", await run_variant(tool, base, goals, concurrency)))
        await tool.aclose()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    server = ctx.Process(target=serve, args=(q, args.pages), daemon=True)
    server.start()
    try:
        port = q.get(timeout=60)
        rows = asyncio.run(bench(f"http://127.0.0.1:{port}", args.pages, args.concurrency))
    finally:
        server.terminate()
        server.join(5)
    size_kb = len(article(0)[0]) / 1000
    print(f"\nBrowser fetch + select, {args.pages} pages of ~{size_kb:.0f} kB HTML, "
          f"{args.concurrency} in flight, no summarizer, local server in its own process\n")
    print("| variant | pages | failed | wall s | pages/s | p50 latency s | p95 latency s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['pages']} | {r['failed']} | {r['wall']:.2f} | {r['pps']:.1f} | {r['p50']:.3f} | {r['p95']:.3f} |")


if __name__ == "__main__":
    main()
