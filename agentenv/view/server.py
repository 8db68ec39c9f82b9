"""`agentenv view`: one local page over a run or a bench folder, served by aiohttp on 127.0.0.1.

The page (`static/`: plain HTML, JS and CSS, no build step, nothing fetched
from outside) asks a small JSON API; every answer carries `problems`, the
sentences the page shows for what could not be read. Files are read on each
request, so a live run's new steps appear as they are written.

    GET /                          the page
    GET /api/info                  run or bench, its runs (algorithm, backend, live), the bench's table
    GET /api/metrics?run=ID        a run's metric records
    GET /api/steps?run=ID          its recorded steps, or why there are none
    GET /api/groups?run=ID&split=train&step=N&offset=0&limit=20
    GET /api/task?task=ID          a bench: that task's recorded groups under each run
    GET /api/bench_curves?key=K    a bench: per variant, mean and min-max band over seeds
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from agentenv.view.loader import MAX_GROUPS_PER_PAGE, Folder, Loaded, ViewError

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, problems: list[str] | None = None, status: int = 200) -> web.Response:
    body = {"data": data, "problems": problems or []}
    return web.Response(text=json.dumps(body, default=str, allow_nan=False), status=status,
                        content_type="application/json")  # fmt: skip


LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})


def _int(request: web.Request, key: str, default: int | None = None) -> int:
    raw = request.query.get(key)
    if raw is None:
        if default is None:
            raise ViewError(f"the request needs ?{key}=")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ViewError(f"?{key}= must be an integer, got {raw!r}") from None


class ViewServer:
    """The viewer's server.

    Args:
        folder: The run or bench folder.
        host: Where to listen (127.0.0.1: this machine only).
        port: 0 picks a free one (`port` is the bound one after `start`).
    """

    def __init__(self, folder: Folder, host: str = "127.0.0.1", port: int = 0):
        self.folder = folder
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._local_only, self._errors])
        app.router.add_get("/", self._index)
        app.router.add_static("/static/", STATIC, show_index=False)
        app.router.add_get("/api/info", self._info)
        app.router.add_get("/api/metrics", self._metrics)
        app.router.add_get("/api/steps", self._steps)
        app.router.add_get("/api/groups", self._groups)
        app.router.add_get("/api/task", self._task)
        app.router.add_get("/api/bench_curves", self._bench_curves)
        return app

    async def start(self) -> ViewServer:
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # set once start() returned
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def aclose(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ---- handlers -------------------------------------------------------
    @web.middleware
    async def _local_only(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Only a page this machine opened by its loopback name: a web page that rebinds its own name to
        127.0.0.1 (DNS rebinding) would otherwise read the run's rollouts through the visitor's browser."""
        host = (request.host or "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in LOCAL_HOSTS and name != self.host:
            return _json(None, [f"agentenv view answers only at {self.url} (this request's Host was {host!r})"], status=403)
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A bad request or an unreadable folder: a JSON message, never a traceback."""
        try:
            return await handler(request)
        except ViewError as e:
            return _json(None, [str(e)], status=400)
        except web.HTTPException:
            raise
        except Exception as e:  # noqa: BLE001 - the page shows the one line; the log keeps the traceback
            log.exception("agentenv view: %s failed", request.path)
            return _json(None, [f"{request.path}: {type(e).__name__}: {e}"], status=500)

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _off_loop(self, fn: Callable[[], Loaded]) -> web.Response:
        """Files are read in a thread: a large step does not hold up the other requests."""
        got = await asyncio.get_running_loop().run_in_executor(None, fn)
        return _json(got.data, got.problems)

    async def _info(self, request: web.Request) -> web.Response:
        info = await asyncio.get_running_loop().run_in_executor(None, self.folder.info)
        return _json(info, info.pop("problems"))

    async def _metrics(self, request: web.Request) -> web.Response:
        run = self.folder.run(request.query.get("run", "."))
        return await self._off_loop(run.metrics)

    async def _steps(self, request: web.Request) -> web.Response:
        run = self.folder.run(request.query.get("run", "."))
        return await self._off_loop(run.rollout_files)

    async def _groups(self, request: web.Request) -> web.Response:
        run = self.folder.run(request.query.get("run", "."))
        split = request.query.get("split", "train")
        step = _int(request, "step")
        offset = max(0, _int(request, "offset", 0))
        limit = _int(request, "limit", MAX_GROUPS_PER_PAGE)
        return await self._off_loop(functools.partial(run.groups, split, step, offset, limit))

    async def _task(self, request: web.Request) -> web.Response:
        task = request.query.get("task")
        if not task:
            raise ViewError("the request needs ?task=")

        def load() -> Loaded:
            out: dict[str, Any] = {}
            problems: list[str] = []
            for rid, run in self.folder.runs.items():
                got = run.task_groups(task)
                out[rid] = got.data
                problems += [f"{rid}: {p}" for p in got.problems]
            return Loaded(out, problems)

        return await self._off_loop(load)

    async def _bench_curves(self, request: web.Request) -> web.Response:
        keys = request.query.getall("key", [])
        if not keys:
            raise ViewError("the request needs ?key= (one or more metric names)")
        return await self._off_loop(functools.partial(self.folder.bench_curves, keys))


async def serve(path: str | Path, host: str = "127.0.0.1", port: int = 0, on_start: Callable[[str], None] | None = None) -> None:
    """Serve `path` until cancelled (Ctrl-C).

    Raises:
        ViewError: The folder cannot be viewed.
    """
    server = await ViewServer(Folder.open(path), host, port).start()
    try:
        if on_start is not None:
            on_start(server.url)
        await asyncio.Event().wait()
    finally:
        await server.aclose()
