"""A warm pool of sandbox containers, each running `runner.py` as PID 1.

Host <-> runner channel: the container's own stdin/stdout, held open through
one docker attach stream per container, one JSON object per line each way. A
call costs one write and one read on a socket the pool already holds (no
`docker exec`, no process start on the host).

The pool does its I/O on its own event loop in a background thread, so it
can be used from any event loop (or none), and `SandboxSession.fork()` can be
synchronous without blocking on the runner: frames to one container are sent
in the order they are submitted and the runner serves one session's requests
in order, so a fork always copies the state after the calls submitted before it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import itertools
import json
import logging
import os
import socket
import threading
import uuid
import weakref
from dataclasses import dataclass
from importlib import resources
from typing import Any

from agentenv._reaper import reap_containers_on_exit
from agentenv.errors import ToolError
from agentenv.tools.python_sandbox._docker import SETUP_HINT, docker_client, require_image
from agentenv.tools.python_sandbox.config import PythonSandboxConfig

log = logging.getLogger(__name__)

_STREAM_LIMIT = 64 * 1024 * 1024  # one reply line holds at most ~2 x (head + tail) of text, JSON-escaped
# A runner that has not answered timeout_s + this after a call is considered hung and its container
# replaced. The runner enforces every call's deadline itself, so this only catches a runner that is
# truly stuck (calls answer within timeout + 2 s even with both cores busy).
_GUARD_S = 10.0


@dataclass
class ExecResult:
    """What one call did inside the sandbox.

    Attributes:
        stdout: Standard output, cut to head + tail with a marker between.
        stderr: Standard error (tracebacks), cut the same way.
        exit_code: Exit status, or None when killed by a signal.
        signal: The signal that killed the call's process, if any.
        timed_out: Killed for passing the wall-clock timeout.
        oom: Killed by the kernel for passing the memory limit.
        output_limit: Killed for printing more than the output limit.
        error: One line naming the exception (`ZeroDivisionError: division by zero`),
            or the reason the call could not run.
        duration_s: Time inside the sandbox.
        stdout_bytes: Bytes printed to stdout before the cut.
        stderr_bytes: Bytes printed to stderr before the cut.
        rolled_back: Session mode: the cell's process died, so the session's
            variables are as they were before the call.
        session_lost: Session mode: the session is gone (its state with it).
        container: Short id of the container that ran the call.
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    oom: bool = False
    output_limit: bool = False
    error: str | None = None
    duration_s: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    rolled_back: bool = False
    session_lost: bool = False
    container: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.exit_code == 0
            and not (self.timed_out or self.oom or self.output_limit or self.session_lost)
            and self.signal is None
        )

    @classmethod
    def from_reply(cls, reply: dict[str, Any], container: str) -> "ExecResult":
        return cls(
            stdout=reply.get("stdout", ""),
            stderr=reply.get("stderr", ""),
            exit_code=reply.get("exit"),
            signal=reply.get("signal"),
            timed_out=bool(reply.get("timed_out")),
            oom=bool(reply.get("oom")),
            output_limit=bool(reply.get("output_limit")),
            error=reply.get("error"),
            duration_s=float(reply.get("duration", 0.0)),
            stdout_bytes=int(reply.get("stdout_bytes", 0)),
            stderr_bytes=int(reply.get("stderr_bytes", 0)),
            rolled_back=bool(reply.get("rolled_back")),
            session_lost=bool(reply.get("session_lost")),
            container=container,
        )


class SessionLost(Exception):
    """A session's processes are gone (its container died or it was killed)."""


class _ChannelClosed(Exception):
    pass


def runner_source() -> str:
    return resources.files("agentenv.tools.python_sandbox").joinpath("runner.py").read_text(encoding="utf-8")


def _owner_id() -> str:
    """`pid:starttime@host`: identifies this process even after its pid is reused."""
    return f"{os.getpid()}:{_start_time(os.getpid())}@{socket.gethostname()}"


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "?"


def _owner_alive(owner: str) -> bool:
    """False only when `owner` names a process on this host that is gone."""
    try:
        pid_start, host = owner.rsplit("@", 1)
        pid, start = pid_start.split(":")
    except ValueError:
        return True  # not ours to judge
    if host != socket.gethostname():
        return True
    return _start_time(int(pid)) == start


class _Channel:
    """One container: its docker attach stream, its pending requests, its sessions."""

    def __init__(self, container_id: str, keep: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.id = container_id
        self.short = container_id[:12]
        self._keep = keep  # the SDK's socket wrapper (and HTTP response) must outlive the stream
        self.reader, self.writer = reader, writer
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future | concurrent.futures.Future] = {}
        self.sessions: set[str] = set()
        self.closed = False
        self.stderr_tail = b""
        self.reader_task: asyncio.Task | None = None

    def send(self, msg: dict[str, Any], fut: asyncio.Future | concurrent.futures.Future) -> None:
        """Sends one request; `fut` gets the reply dict. Pool loop only."""
        if self.closed:
            _set_exc(fut, _ChannelClosed(f"container {self.short} is gone"))
            return
        msg["id"] = next(self.ids)
        self.pending[msg["id"]] = fut
        self.writer.write((json.dumps(msg, ensure_ascii=True) + "\n").encode())

    async def read_loop(self) -> None:
        buf = bytearray()
        try:
            while True:
                header = await self.reader.readexactly(8)
                size = int.from_bytes(header[4:8], "big")
                payload = await self.reader.readexactly(size)
                if header[0] == 2:  # the runner's stderr: log it, keep the tail for errors
                    self.stderr_tail = (self.stderr_tail + payload)[-4000:]
                    log.debug("runner %s: %s", self.short, payload.decode("utf-8", "replace").rstrip())
                    continue
                buf += payload
                while (i := buf.find(b"\n")) >= 0:
                    line, buf[:] = bytes(buf[:i]), buf[i + 1 :]
                    self._dispatch(line)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.fail_all(f"container {self.short} is gone")

    def _dispatch(self, line: bytes) -> None:
        try:
            reply = json.loads(line)
        except ValueError:
            log.warning("runner %s sent a bad line: %r", self.short, line[:200])
            return
        fut = self.pending.pop(reply.get("id"), None)
        if fut is not None and not fut.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError, asyncio.InvalidStateError):
                fut.set_result(reply)  # the caller may cancel from its own thread meanwhile

    def fail_all(self, why: str) -> None:
        self.closed = True
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            _set_exc(fut, _ChannelClosed(why))
        with contextlib.suppress(Exception):
            self.writer.close()


def _set_exc(fut: asyncio.Future | concurrent.futures.Future, exc: BaseException) -> None:
    if not fut.done():
        with contextlib.suppress(concurrent.futures.InvalidStateError, asyncio.InvalidStateError):
            fut.set_exception(exc)


class _LoopThread:
    """An event loop of its own, in a daemon thread."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def in_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_loop():
            self.thread.join(5)
            if not self.thread.is_alive():
                self.loop.close()


_LIVE_POOLS: "weakref.WeakSet[SandboxPool]" = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool._remove_containers_blocking()


class SandboxPool:
    """Warm containers, started once and reused.

    Args:
        config: Image, pool size, limits. Defaults to `PythonSandboxConfig()`.

    Usage:
        pool = SandboxPool(cfg)
        await pool.start()                 # idempotent; ToolError if no daemon / no image
        r = await pool.run("print(1)")     # stateless: a fresh process per call
        s = await pool.open_session()      # session: variables persist; s.fork() copies them
        await pool.aclose()                # removes the containers (atexit does too)
    """

    def __init__(self, config: PythonSandboxConfig | None = None):
        self.config = config or PythonSandboxConfig()
        self._io_thread: _LoopThread | None = None  # started on first use
        self._client: Any = None
        self._channels: list[_Channel] = []
        self._idle: asyncio.Queue | None = None  # stateless leases, created in the pool loop
        self._start_lock: asyncio.Lock | None = None
        self._started = False
        self._closed = False
        self._broken: ToolError | None = None
        self._container_ids: set[str] = set()
        self._owner = _owner_id()
        self._runner_src = runner_source()
        self._replacing = 0
        _LIVE_POOLS.add(self)

    @property
    def _io(self) -> _LoopThread:
        if self._io_thread is None:
            self._io_thread = _LoopThread("agentenv-sandbox-io")
        return self._io_thread

    # -- public API (callable from any event loop) ----------------------------

    @property
    def containers(self) -> list[str]:
        """Ids of the containers this pool holds now."""
        return [ch.id for ch in self._channels if not ch.closed]

    async def start(self) -> None:
        """Removes containers that crashed runs left behind and starts `pool_size` containers."""
        await self._call(self._start())

    async def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        """Runs `code` in a fresh process of an idle container (stateless)."""
        timeout = float(timeout_s or self.config.timeout_s)
        return await self._call(self._run_stateless(code, timeout))

    async def open_session(self) -> "SandboxSession":
        """A new empty session on the container that holds the fewest sessions."""
        return await self._call(self._open_session())

    async def aclose(self) -> None:
        """Removes this pool's containers and stops its I/O thread."""
        if self._closed:
            return
        if self._io_thread is None:  # never used
            self._closed = True
            return
        await self._call(self._shutdown())
        self._io.stop()

    def close(self) -> None:
        """Synchronous `aclose` (for `finally` blocks and scripts)."""
        if self._closed:
            return
        if self._io_thread is None:
            self._closed = True
            return
        if self._io.loop.is_running() and not self._io.in_loop():
            self._io.submit(self._shutdown()).result(self.config.docker_timeout_s + 30)
        else:
            self._remove_containers_blocking()
            self._closed = True
        self._io.stop()

    # -- internals -------------------------------------------------------------

    async def _call(self, coro):
        """Runs `coro` on the pool loop and awaits it from the caller's loop."""
        if self._io.in_loop():
            return await coro
        return await asyncio.wrap_future(self._io.submit(coro))

    def _send(self, ch: _Channel, msg: dict[str, Any]) -> concurrent.futures.Future:
        """Queues one frame to `ch` in submission order; the future gets the reply. Any thread."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._io.in_loop():
            ch.send(msg, fut)
        else:
            self._io.loop.call_soon_threadsafe(ch.send, msg, fut)
        return fut

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def _start(self) -> None:
        if self._closed:
            raise ToolError("the sandbox pool is closed")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
            self._idle = asyncio.LifoQueue()  # the container used last is the warmest
        async with self._start_lock:
            if self._started:
                return
            cfg = self.config
            self._client = await self._blocking(docker_client, cfg.docker_timeout_s)
            await self._blocking(require_image, self._client, cfg.image)
            await self._blocking(self._remove_orphans)
            # Ours go with this process even if it is SIGKILLed (not only at the next start).
            await self._blocking(reap_containers_on_exit, f"{cfg.label}.owner={self._owner}")
            channels = await asyncio.gather(
                *(self._new_channel() for _ in range(cfg.pool_size)), return_exceptions=True
            )
            errors = [c for c in channels if isinstance(c, BaseException)]
            for ch in channels:
                if isinstance(ch, _Channel):
                    self._add(ch)
            if errors:
                for ch in self._channels:
                    ch.fail_all("the sandbox pool failed to start")
                self._channels = []
                self._idle = asyncio.LifoQueue()  # the container used last is the warmest
                await self._blocking(self._remove_containers_blocking)
                err = errors[0]
                raise err if isinstance(err, ToolError) else ToolError(f"sandbox container failed to start: {err}")
            self._started = True

    def _add(self, ch: _Channel) -> None:
        self._channels.append(ch)
        if self.config.mode == "stateless":
            self._idle.put_nowait(ch)

    def _remove_orphans(self) -> None:
        """Removes labelled containers whose owner process (on this host) is dead."""
        label = self.config.label
        for c in self._client.api.containers(all=True, filters={"label": f"{label}=1"}):
            owner = (c.get("Labels") or {}).get(f"{label}.owner", "")
            if owner and not _owner_alive(owner):
                log.info("removing sandbox container %s left by dead process %s", c["Id"][:12], owner)
                with contextlib.suppress(Exception):
                    self._client.api.remove_container(c["Id"], force=True)

    def _create_container(self) -> tuple[str, Any, socket.socket]:
        """Creates, attaches to and starts one container (blocking: runs in an executor)."""
        cfg = self.config
        import docker

        uid, gid = cfg.user.split(":")
        host = self._client.api.create_host_config(
            network_mode="none",
            mem_limit=cfg.memory_bytes,
            memswap_limit=cfg.memory_bytes,  # no swap: the limit is the limit
            pids_limit=cfg.pids_limit,
            nano_cpus=int(cfg.cpus * 1e9),
            read_only=True,
            tmpfs={"/work": f"rw,nosuid,nodev,size={cfg.workdir_size_mb}m,uid={uid},gid={gid},mode=0700"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            shm_size=16 * 1024 * 1024,
            ulimits=[
                docker.types.Ulimit(name="nofile", soft=1024, hard=1024),
                docker.types.Ulimit(name="core", soft=0, hard=0),
            ],
        )
        created = self._client.api.create_container(
            cfg.image,
            command=[
                "python3",
                "-I",
                "-c",
                self._runner_src,
                json.dumps({"preload": cfg.preload, "warmup": cfg.warmup}),
            ],
            user=cfg.user,
            stdin_open=True,
            tty=False,
            working_dir="/work",
            environment={
                "HOME": "/work",
                "TMPDIR": "/work",
                "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1",
                "OPENBLAS_NUM_THREADS": "1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            },
            labels={cfg.label: "1", f"{cfg.label}.owner": self._owner},
            name=f"agentenv-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}",
            host_config=host,
            network_disabled=True,
        )
        cid = created["Id"]
        self._container_ids.add(cid)
        try:
            keep = self._client.api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            sock = getattr(keep, "_sock", keep)
            self._client.api.start(cid)
        except Exception:
            self._remove_blocking(cid)
            raise
        return cid, keep, sock

    async def _new_channel(self) -> _Channel:
        try:
            cid, keep, sock = await self._blocking(self._create_container)
        except ToolError:
            raise
        except Exception as e:
            raise ToolError(f"could not start a sandbox container from {self.config.image!r}: {e}; {SETUP_HINT}") from e
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=_STREAM_LIMIT)
        ch = _Channel(cid, keep, reader, writer)
        ch.reader_task = asyncio.get_running_loop().create_task(ch.read_loop())
        fut = asyncio.get_running_loop().create_future()
        ch.send({"op": "hello"}, fut)
        try:
            hello = await asyncio.wait_for(fut, self.config.start_timeout_s)
        except (asyncio.TimeoutError, _ChannelClosed) as e:
            tail = ch.stderr_tail.decode("utf-8", "replace").strip()
            await self._blocking(self._remove_blocking, cid)
            why = f"{type(e).__name__}: {tail[-800:] or 'no output'}"
            raise ToolError(
                f"sandbox container {cid[:12]} did not start its runner ({why}); "
                f"is {self.config.image!r} an image with python3? rebuild it with `agentenv sandbox build`"
            ) from e
        log.debug("sandbox container %s ready: %s", ch.short, hello)
        return ch

    def _replace(self, ch: _Channel) -> None:
        """Drops a dead or hung container and starts another in the background."""
        if ch in self._channels:
            self._channels.remove(ch)
        ch.fail_all(f"container {ch.short} was replaced")
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, self._remove_blocking, ch.id)
        if self._closed:
            return
        self._replacing += 1

        async def replace() -> None:
            try:
                self._add(await self._new_channel())
            except Exception as e:
                self._broken = e if isinstance(e, ToolError) else ToolError(f"sandbox container failed to start: {e}")
                if self._idle is not None:
                    self._idle.put_nowait(None)  # wake waiters so they raise
            finally:
                self._replacing -= 1

        loop.create_task(replace())

    async def _lease(self) -> _Channel:
        while True:
            if self._broken is not None and not any(not c.closed for c in self._channels) and not self._replacing:
                raise self._broken
            ch = await self._idle.get()
            if ch is None:
                if self._broken is not None:
                    self._idle.put_nowait(None)
                    raise self._broken
                continue
            if ch.closed or ch not in self._channels:
                if ch in self._channels:
                    self._replace(ch)
                continue
            return ch

    async def _run_stateless(self, code: str, timeout: float) -> ExecResult:
        await self._start()
        ch = await self._lease()
        fut = asyncio.get_running_loop().create_future()
        ch.send(self._run_msg(code, timeout), fut)
        try:
            reply = await asyncio.wait_for(asyncio.shield(fut), timeout + _GUARD_S)
        except asyncio.TimeoutError:
            # The shielded reply future fails with _ChannelClosed once the channel is replaced:
            # nobody waits for it any more, so retrieve that exception instead of logging it.
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._replace(ch)
            return ExecResult(
                error=f"the sandbox did not answer within {timeout + _GUARD_S:.0f} s and was restarted",
                container=ch.short,
            )
        except _ChannelClosed:
            self._replace(ch)
            return ExecResult(error="the sandbox container died during the call and was restarted", container=ch.short)
        except asyncio.CancelledError:
            # The caller gave up; the container is free again once the runner answers.
            fut.add_done_callback(lambda f: self._release(ch))
            raise
        self._release(ch)
        return (
            ExecResult.from_reply(reply, ch.short)
            if reply.get("ok")
            else ExecResult(error=reply.get("fail"), container=ch.short)
        )

    def _release(self, ch: _Channel) -> None:
        if ch.closed:
            if ch in self._channels:
                self._replace(ch)
        elif not self._closed:
            self._idle.put_nowait(ch)

    def _run_msg(self, code: str, timeout: float, sid: str | None = None) -> dict[str, Any]:
        cfg = self.config
        return {
            "op": "run",
            "sid": sid,
            "code": code,
            "timeout": timeout,
            "print_last": cfg.print_last_expr,
            "limits": self._limits(),
        }

    def _limits(self) -> dict[str, int]:
        cfg = self.config
        return {
            "head": cfg.output_head_bytes,
            "tail": cfg.output_tail_bytes,
            "output_limit": cfg.output_limit_bytes,
            "address_space": int(cfg.address_space_factor * cfg.memory_bytes),
        }

    async def _open_session(self) -> "SandboxSession":
        await self._start()
        live = [c for c in self._channels if not c.closed]
        if not live:
            if self._broken is not None:
                raise self._broken
            raise ToolError(f"the sandbox pool has no live container; {SETUP_HINT}")
        ch = min(live, key=lambda c: len(c.sessions))
        sid = uuid.uuid4().hex[:12]
        fut = asyncio.get_running_loop().create_future()
        ch.send({"op": "open", "sid": sid, "limits": self._limits()}, fut)
        try:
            reply = await asyncio.wait_for(fut, self.config.start_timeout_s)
        except (asyncio.TimeoutError, _ChannelClosed) as e:
            self._replace(ch)
            raise SessionLost(f"container {ch.short} did not open a session: {e}") from e
        if not reply.get("ok"):
            raise SessionLost(reply.get("fail", "could not open a session"))
        ch.sessions.add(sid)
        return SandboxSession(self, ch, sid)

    async def _shutdown(self) -> None:
        self._closed = True
        channels, self._channels = self._channels, []
        for ch in channels:
            ch.fail_all("the sandbox pool is closed")
        if self._idle is not None:
            self._idle.put_nowait(None)
            self._broken = self._broken or ToolError("the sandbox pool is closed")
        await self._blocking(self._remove_containers_blocking)

    def _remove_blocking(self, cid: str) -> None:
        client = self._client
        if client is None:
            return
        with contextlib.suppress(Exception):
            client.api.remove_container(cid, force=True)
        self._container_ids.discard(cid)

    def _remove_containers_blocking(self) -> None:
        ids = list(self._container_ids)
        if not ids or self._client is None:
            return
        try:
            with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(ids)))) as ex:
                list(ex.map(self._remove_blocking, ids))
        except RuntimeError:  # at interpreter exit no new threads may start: one by one
            for cid in ids:
                self._remove_blocking(cid)


class SandboxSession:
    """Live variables in one container, like a notebook kernel. Forkable.

    Calls on one session run in the order they are made. `fork()` returns at
    once: the copy is taken inside the container after the calls already
    submitted and before any later one.
    """

    def __init__(
        self, pool: SandboxPool, channel: _Channel, sid: str, created: concurrent.futures.Future | None = None
    ):
        self.pool = pool
        self.channel = channel
        self.sid = sid
        self._created = created  # the fork's reply, for sessions made by fork()
        self.closed = False

    async def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        """Runs `code` as the session's next cell.

        Raises:
            SessionLost: the session's processes are gone; open a new one.
        """
        if self.closed:
            raise SessionLost("the session is closed")
        timeout = float(timeout_s or self.pool.config.timeout_s)
        fut = self.pool._send(self.channel, self.pool._run_msg(code, timeout, self.sid))
        try:
            # A fork that has not happened yet delays the first call; allow for the parent's call too.
            budget = timeout + _GUARD_S + (self.pool.config.timeout_s if self._created is not None else 0.0)
            reply = await asyncio.wait_for(asyncio.wrap_future(fut), budget)
        except _ChannelClosed as e:
            self.closed = True
            raise SessionLost(str(e)) from e
        except asyncio.TimeoutError as e:
            self.closed = True
            self.pool._io.loop.call_soon_threadsafe(self.pool._replace, self.channel)
            raise SessionLost(f"container {self.channel.short} stopped answering and was restarted") from e
        self._created = None
        if not reply.get("ok"):
            self.closed = True
            raise SessionLost(reply.get("fail", "session lost"))
        result = ExecResult.from_reply(reply, self.channel.short)
        if result.session_lost:
            self.closed = True
        return result

    def fork(self) -> "SandboxSession":
        """An independent copy of this session's live state. Does not block."""
        if self.closed:
            raise SessionLost("cannot fork a closed session")
        sid = uuid.uuid4().hex[:12]
        fut = self.pool._send(self.channel, {"op": "fork", "sid": self.sid, "new": sid})
        self.channel.sessions.add(sid)
        return SandboxSession(self.pool, self.channel, sid, created=fut)

    async def aclose(self) -> None:
        """Kills the session's processes and frees its files."""
        if self.closed:
            return
        self.closed = True
        self.channel.sessions.discard(self.sid)
        if self.channel.closed:
            return
        fut = self.pool._send(self.channel, {"op": "close", "sid": self.sid})
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.wrap_future(fut), 10)
