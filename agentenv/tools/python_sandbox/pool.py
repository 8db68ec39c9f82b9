"""A warm pool of sandbox containers, each running `runner.py` as PID 1.

Host <-> runner channel: the container's own stdin/stdout, held open through
one docker attach stream per container, one JSON object per line each way. A
call costs one write and one read on a socket the pool already holds (no
`docker exec`, no process start on the host).

Isolation: inside a container every stateless call and every session runs
under a uid of its own, forked from a clean template, and nothing of it
outlives its call; `runner.py`'s docstring holds the threat model and how each
boundary is enforced. The host's side of it: containers run the runner as root
with six capabilities under no-new-privileges, no network, a read-only root,
a private /work (0711) with a bounded number of files, no SysV IPC and no POSIX
queues (IPC-namespace sysctls at 0), a pids limit sized for `sessions_per_container`
episodes of `pids_limit` processes each, and a capped Docker log. Nothing that
comes out of a container is trusted: every reply is type-checked
(`ExecResult.from_reply`) and a wrong value becomes an error result.

Healing: a container that dies (or is killed from outside) is replaced at
once, and one that stops answering (frozen, stuck) is replaced when a call
passes its timeout by 1 s and the runner does not answer a ping within 0.5 s; replacement
retries while the pool is open, so the pool stays at `pool_size` while the
daemon answers. Sessions on a replaced container report `SessionLost`.

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
import math
import os
import socket
import uuid
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, fields, replace
from importlib import resources
from typing import Any, TypeVar, cast

from agentenv._loops import LoopThread
from agentenv._reaper import reap_containers_on_exit
from agentenv.errors import ToolError
from agentenv.tools.python_sandbox._docker import SETUP_HINT, docker_client, require_image
from agentenv.tools.python_sandbox.config import PythonSandboxConfig, call_timeout

R = TypeVar("R")

log = logging.getLogger(__name__)

_STREAM_LIMIT = 64 * 1024 * 1024  # one reply line holds at most ~2 x (head + tail) of text, JSON-escaped
# The runner enforces every call's deadline itself. A reply missing at timeout + _GUARD_S makes the
# pool ping the runner: no answer within _PING_S (a frozen or stuck container) and the container is
# replaced, so a call answers within timeout + 1.5 s. A runner that answers pings is only slow and is
# waited for, up to timeout + _HARD_S (so an early guard costs a ping, never a container).
_GUARD_S = 1.0
_PING_S = 0.5
_HARD_S = 60.0
_OPEN_S = 5.0  # an open or fork answers in milliseconds; past this the runner is pinged
# What the runner keeps of root: chown/search/remove episode directories, kill any uid, switch uids.
RUNNER_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID")
_WORK_INODES = 16384  # files in /work: removing a call's directory never stalls the runner long
# No SysV IPC and no POSIX message queues: their keys and names are one namespace shared by every
# episode of a container (one could create key 1234 with mode 0666 before another asks for it), and
# nothing but CAP_SYS_ADMIN could give an episode a namespace of its own.
_IPC_SYSCTLS = {
    "kernel.shmmni": "0",
    "kernel.msgmni": "0",
    "kernel.sem": "0 0 0 0",
    "fs.mqueue.queues_max": "0",
}
_LOG_CONFIG = {"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}}


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
    def from_reply(cls, reply: Any, container: str) -> ExecResult:
        """The result a runner reply describes. Any field of the wrong type (the reply
        comes from inside the container) makes it an error result, never an exception."""
        if not isinstance(reply, dict):
            return cls(error=f"the sandbox sent a malformed reply ({type(reply).__name__})", container=container)
        if reply.get("ok") is not True:
            fail = reply.get("fail")
            return cls(error=fail if isinstance(fail, str) else "the sandbox refused the call", container=container)
        values = {f.name: reply.get(key, f.default) for key, f in zip(_REPLY_KEYS, fields(cls)) if key}
        return cls(**values, container=container).checked()

    def checked(self) -> ExecResult:
        """This result if every field has its type, else a copy that says which do not."""
        bad = [f.name for f in fields(self) if not _valid(getattr(self, f.name), cast(str, f.type))]  # text: postponed annotations
        if not bad:
            return self
        clean = {name: _FALLBACK[name] for name in bad}
        clean.update(exit_code=None, error=f"the sandbox sent a malformed reply (bad {', '.join(bad)})")
        return replace(self, **clean)


# Reply key of each ExecResult field, in field order (container is the host's own).
_REPLY_KEYS = (
    "stdout", "stderr", "exit", "signal", "timed_out", "oom", "output_limit", "error",
    "duration", "stdout_bytes", "stderr_bytes", "rolled_back", "session_lost", None,
)  # fmt: skip
_FALLBACK: dict[str, Any] = {f.name: f.default for f in fields(ExecResult)}


def _valid(value: Any, kind: str) -> bool:
    """`value` has the annotated type `kind` (bools are not ints, counts and times are >= 0)."""
    if kind == "str":
        return isinstance(value, str)
    if kind == "str | None":
        return value is None or isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind in ("int", "int | None"):
        if value is None:
            return kind == "int | None"
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 63
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return False


def _failure(r: ExecResult) -> str:
    """One line saying why a call that should have printed 1 did not."""
    if r.error:
        return r.error
    if r.stderr.strip():
        return r.stderr.strip().splitlines()[-1][:300]
    return f"exit {r.exit_code}, signal {r.signal}, printed {r.stdout[:100]!r}"


class SessionLost(Exception):
    """A session's processes are gone (its container died or it was killed)."""


class _ChannelClosed(Exception):
    pass


class _Hung(Exception):
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


class _Family:
    """A session and the sessions forked from it: one uid inside, one slot of a container."""

    def __init__(self, channel: _Channel):
        self.channel = channel
        self.members = 1


class _Channel:
    """One container: its docker attach stream, its pending requests, what it holds."""

    def __init__(self, container_id: str, keep: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.id = container_id
        self.short = container_id[:12]
        self._keep = keep  # the SDK's socket wrapper (and HTTP response) must outlive the stream
        self.reader, self.writer = reader, writer
        self.ids = itertools.count(1)
        self.pending: dict[int, concurrent.futures.Future[Any]] = {}
        self.families: set[_Family] = set()  # open sessions (with their forks)
        self.jobs = 0  # stateless calls in flight on a session-mode pool
        self.closed = False
        self.on_close: Any = None  # the pool's callback when the stream ends
        self.stderr_tail = b""
        self.reader_task: asyncio.Task[Any] | None = None

    @property
    def load(self) -> int:
        return len(self.families) + self.jobs

    def send(self, msg: dict[str, Any], fut: concurrent.futures.Future[Any]) -> None:
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
            reply = None
        rid = reply.get("id") if isinstance(reply, dict) else None
        if not isinstance(rid, int) or isinstance(rid, bool):
            log.warning("runner %s sent a bad line: %r", self.short, line[:200])
            return
        fut = self.pending.pop(rid, None)
        if fut is not None and not fut.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                fut.set_result(reply)  # the caller may cancel from its own thread meanwhile

    def fail_all(self, why: str) -> None:
        first = not self.closed
        self.closed = True
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            _set_exc(fut, _ChannelClosed(why))
        with contextlib.suppress(Exception):
            self.writer.close()
        if first and self.on_close is not None:
            self.on_close(self)

    async def stop_reading(self) -> None:
        """Ends the read loop and waits for it (a loop stopped with it pending warns at exit). Pool loop."""
        task = self.reader_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _set_exc(fut: concurrent.futures.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            fut.set_exception(exc)


_LIVE_POOLS: weakref.WeakSet[SandboxPool] = weakref.WeakSet()


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
        r = await pool.run("print(1)")     # stateless: a fresh process (and uid) per call
        s = await pool.open_session()      # session: variables persist; s.fork() copies them
        await pool.aclose()                # removes the containers (atexit does too)

    In stateless mode a container runs one call at a time. In session mode a
    container holds up to `sessions_per_container` sessions (a fork shares its
    session's slot) and stateless calls (`run`) take a slot while they run; an
    `open_session` or `run` that finds every slot taken waits for one up to
    `start_timeout_s`.
    """

    def __init__(self, config: PythonSandboxConfig | None = None):
        self.config = config or PythonSandboxConfig()
        self._io_thread: LoopThread | None = None  # started on first use
        self._client: Any = None
        self._channels: list[_Channel] = []
        self._idle: asyncio.Queue[_Channel | None] | None = None  # stateless leases, created in the pool loop
        self._changed: asyncio.Event | None = None  # set (and renewed) when a slot or container frees up
        self._start_task: asyncio.Task[Any] | None = None  # the one start, on the pool loop (see `_start`)
        self._closing: asyncio.Event | None = None  # set by a close: replacements stop retrying
        self._started = False
        self._closed = False
        self._broken: ToolError | None = None  # the last failure to start a container
        self._container_ids: set[str] = set()
        self._owner = _owner_id()
        self._runner_src = runner_source()
        self._replacing: set[asyncio.Task[Any]] = set()  # replacements in flight
        _LIVE_POOLS.add(self)

    @property
    def _io(self) -> LoopThread:
        if self._io_thread is None:
            self._io_thread = LoopThread("agentenv-sandbox-io")
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
        """Runs `code` in a fresh process under a fresh uid (stateless), in either mode."""
        timeout = call_timeout(timeout_s, self.config)
        return await self._call(self._run_stateless(code, timeout))

    async def open_session(self) -> SandboxSession:
        """A new empty session on the container that holds the fewest."""
        return await self._call(self._open_session())

    async def health_check(self) -> None:
        """Starts the pool if needed and runs `print(1)` in every one of its containers.

        Raises:
            ToolError: the pool cannot start, or a container did not print 1 (each is named, with why).
        """
        await self._call(self._health_check())

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

    async def _call(self, coro: Coroutine[Any, Any, R]) -> R:
        """Runs `coro` on the pool loop and awaits it from the caller's loop."""
        if self._io.in_loop():
            return await coro
        return await asyncio.wrap_future(self._io.submit(coro))

    def _send(self, ch: _Channel, msg: dict[str, Any]) -> concurrent.futures.Future[Any]:
        """Queues one frame to `ch` in submission order; the future gets the reply. Any thread."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._io.call_soon(ch.send, msg, fut)
        return fut

    async def _await_reply(self, ch: _Channel, fut: concurrent.futures.Future[Any], budget: float) -> Any:
        """The reply to a request that should come within `budget` s. Any loop.

        Raises:
            _ChannelClosed: the container died (it is being replaced).
            _Hung: the runner stopped answering; its container is being replaced.
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + budget + _HARD_S
        wait = budget + _GUARD_S
        reply = asyncio.wrap_future(fut)
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(reply), wait)
            except TimeoutError:
                pass
            if loop.time() > end or not await self._alive(ch):
                reply.add_done_callback(lambda f: f.cancelled() or f.exception())
                self._io.call_soon(self._replace, ch)
                raise _Hung(f"container {ch.short} stopped answering")
            wait = _GUARD_S

    async def _alive(self, ch: _Channel) -> bool:
        """Whether the runner answers a ping within _PING_S."""
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._send(ch, {"op": "ping"})), _PING_S)
            return True
        except (TimeoutError, _ChannelClosed):
            return False

    async def _blocking(self, fn: Callable[..., R], *args: object) -> R:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def _notify(self) -> None:
        """Wakes whoever waits for a slot or a container. Pool loop only."""
        if self._changed is not None:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    async def _start(self) -> None:
        """Starts the pool once; every caller waits for that one start.

        The start is the pool's own task, and a caller waits for it shielded: a
        caller that gives up (its call's timeout, which a cold machine's start of
        numpy, sympy and the warm-up in every container can exceed) stops
        waiting, never the start. Were the start the first caller's, its timeout
        would cancel it halfway, leave the containers it had made running, and
        the next call would start all over, again too slowly: every call of the
        first evaluation timed out that way on a fresh machine. A start that
        failed is tried again by the next caller.
        """
        if self._closed:
            raise ToolError("the sandbox pool is closed")
        if self._started:
            return
        if self._start_task is None:
            self._idle = asyncio.LifoQueue()  # the container used last is the warmest
            self._changed = asyncio.Event()
            self._closing = asyncio.Event()
        if self._start_task is None or self._start_task.done():
            self._start_task = asyncio.get_running_loop().create_task(self._start_once())
            self._start_task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, whoever waits
        try:
            await asyncio.shield(self._start_task)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and not (task is not None and task.cancelling()):  # the start, not this caller
                raise ToolError("the sandbox pool was closed while it started") from None
            raise

    async def _start_once(self) -> None:
        try:
            await self._start_containers()
        except ToolError:
            raise
        except Exception as e:  # a Docker API error, a timeout: one line that says so, never a bare traceback
            raise ToolError(f"the sandbox pool could not start: {type(e).__name__}: {e}; {SETUP_HINT}") from e
        self._started = not self._closed

    async def _start_containers(self) -> None:
        """Connects to Docker, checks the image, starts `pool_size` containers (all or none)."""
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
        if errors:
            started = [ch for ch in channels if isinstance(ch, _Channel)]
            for ch in started:
                ch.fail_all("the sandbox pool failed to start")
            await asyncio.gather(*(ch.stop_reading() for ch in started))
            await self._blocking(self._remove_containers_blocking)
            err = errors[0]
            raise err if isinstance(err, ToolError) else ToolError(f"sandbox container failed to start: {err}")
        for ch in cast(list[_Channel], channels):  # no errors: every one started
            self._add(ch)

    async def _health_check(self) -> None:
        await self._start()
        live = [c for c in self._channels if not c.closed]
        timeout = self.config.timeout_s
        results = await asyncio.gather(*(self._exec(ch, self._run_msg("print(1)", timeout), timeout) for ch in live))
        bad = [f"container {r.container}: {_failure(r)}" for r in results if not (r.ok and r.stdout == "1\n")]
        if len(live) < self.config.pool_size:
            why = f" ({self._broken})" if self._broken is not None else ""
            bad.append(f"{self.config.pool_size - len(live)} of {self.config.pool_size} containers are not running{why}")
        if bad:
            raise ToolError(
                f"the sandbox health check failed (`print(1)` in each container of image {self.config.image!r}): "
                + "; ".join(bad)
                + "; check that the image runs python3 (`agentenv sandbox build`) and the limits in "
                "python_sandbox (memory_mb, cpus, pids_limit) fit this machine"
            )

    def _add(self, ch: _Channel) -> None:
        ch.on_close = self._on_channel_closed
        self._channels.append(ch)
        if self.config.mode == "stateless":
            self._idle.put_nowait(ch)
        self._notify()

    def _on_channel_closed(self, ch: _Channel) -> None:
        """A container's stream ended (it died or was killed): start its successor now."""
        if ch in self._channels:
            self._replace(ch)

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

        host = self._client.api.create_host_config(
            network_mode="none",
            mem_limit=cfg.memory_bytes,
            memswap_limit=cfg.memory_bytes,  # no swap: the limit is the limit
            pids_limit=cfg.container_pids_limit,
            nano_cpus=int(cfg.cpus * 1e9),
            read_only=True,
            tmpfs={"/work": f"rw,nosuid,nodev,size={cfg.workdir_size_mb}m,nr_inodes={_WORK_INODES},mode=0711"},
            cap_drop=["ALL"],
            cap_add=list(RUNNER_CAPS),
            security_opt=["no-new-privileges"],
            shm_size=16 * 1024 * 1024,
            sysctls=dict(_IPC_SYSCTLS),
            log_config=docker.types.LogConfig(**_LOG_CONFIG),
            ulimits=[
                docker.types.Ulimit(name="nofile", soft=1024, hard=1024),
                docker.types.Ulimit(name="core", soft=0, hard=0),
            ],
        )
        opts = {"preload": cfg.preload, "warmup": cfg.warmup, "nproc": cfg.pids_limit}
        created = self._client.api.create_container(
            cfg.image,
            command=["python3", "-I", "-c", self._runner_src, json.dumps(opts)],
            user="0:0",  # the runner only: every call drops to a uid of its own
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
        if self._closed:  # closed while we created it, maybe after its removal pass took the ids
            self._remove_blocking(cid)
            raise ToolError("the sandbox pool is closed")
        return cid, keep, sock

    async def _new_channel(self) -> _Channel:
        try:
            cid, keep, sock = await self._blocking(self._create_container)
        except ToolError:
            raise
        except Exception as e:
            raise ToolError(f"could not start a sandbox container from {self.config.image!r}: {e}; {SETUP_HINT}") from e
        ch: _Channel | None = None
        try:
            sock.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=sock, limit=_STREAM_LIMIT)
            ch = _Channel(cid, keep, reader, writer)
            ch.reader_task = asyncio.get_running_loop().create_task(ch.read_loop())
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            ch.send({"op": "hello"}, fut)
            hello = await asyncio.wait_for(asyncio.wrap_future(fut), self.config.start_timeout_s)
            if not isinstance(hello, dict) or hello.get("ok") is not True:
                raise _ChannelClosed(f"bad hello {hello!r:.200}")
        except BaseException as e:  # a runner that does not answer, or a pool closed meanwhile: nothing stays behind
            tail = ch.stderr_tail.decode("utf-8", "replace").strip() if ch is not None else ""
            if ch is not None:
                ch.fail_all("no hello")
                await ch.stop_reading()
            await asyncio.shield(self._blocking(self._remove_blocking, cid))
            if not isinstance(e, (asyncio.TimeoutError, _ChannelClosed)):
                raise
            why = f"{type(e).__name__}: {tail[-800:] or 'no output'}"
            raise ToolError(
                f"sandbox container {cid[:12]} did not start its runner ({why}); "
                f"is {self.config.image!r} an image with python3? rebuild it with `agentenv sandbox build`"
            ) from e
        log.debug("sandbox container %s ready: %s", ch.short, hello)
        return ch

    def _replace(self, ch: _Channel) -> None:
        """Drops a dead or hung container and starts another (retrying while the pool is open). Pool loop."""
        if ch not in self._channels:
            return  # replaced already
        self._channels.remove(ch)
        ch.fail_all(f"container {ch.short} was replaced")
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, self._remove_blocking, ch.id)
        if self._closed:
            return
        task = loop.create_task(self._replace_later())
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace_later(self) -> None:
        delay = 0.5
        while not self._closed:
            try:
                ch = await self._new_channel()
            except Exception as e:
                self._broken = e if isinstance(e, ToolError) else ToolError(f"sandbox container failed to start: {e}")
                log.warning("could not replace a sandbox container (retrying in %.1f s): %s", delay, e)
                if self._idle is not None:
                    self._idle.put_nowait(None)  # wake stateless waiters so they can raise
                self._notify()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), delay)  # a close ends the wait
                delay = min(2 * delay, 30.0)
                continue
            if self._closed:
                ch.fail_all("the sandbox pool is closed")
                await self._blocking(self._remove_blocking, ch.id)
                return
            self._broken = None
            self._add(ch)
            return

    def _no_container(self) -> ToolError | None:
        """The error to raise when no live container is left and the last start failed."""
        if self._broken is not None and not any(not c.closed for c in self._channels):
            return self._broken
        return None

    async def _lease(self) -> _Channel:
        while True:
            if (err := self._no_container()) is not None:
                raise err
            ch = await self._idle.get()
            if ch is None:
                if (err := self._no_container()) is not None:
                    self._idle.put_nowait(None)
                    raise err
                continue
            if ch.closed or ch not in self._channels:
                continue  # its successor is (or will be) in the queue
            return ch

    async def _place(self) -> _Channel:
        """The live container with the fewest sessions and calls, once one has room.
        Its load must be counted before the next await, so concurrent opens spread."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        end = loop.time() + cfg.start_timeout_s
        while True:
            live = [c for c in self._channels if not c.closed]
            free = [c for c in live if c.load < cfg.sessions_per_container]
            if free:
                return min(free, key=lambda c: c.load)
            if (err := self._no_container()) is not None:
                raise err
            if loop.time() >= end:
                raise ToolError(
                    f"no sandbox container had room for another session within {cfg.start_timeout_s:g} s: "
                    f"{len(live)} containers x {cfg.sessions_per_container} sessions are open; close sessions "
                    "you no longer need, or raise python_sandbox.pool_size or sessions_per_container"
                )
            changed = self._changed
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), end - loop.time())

    async def _run_stateless(self, code: str, timeout: float) -> ExecResult:
        await self._start()
        msg = self._run_msg(code, timeout)
        if self.config.mode == "session":
            ch = await self._place()
            ch.jobs += 1
            try:
                return await self._exec(ch, msg, timeout)
            finally:
                ch.jobs -= 1
                self._notify()
        ch = await self._lease()
        fut = self._send(ch, msg)
        try:
            result = await self._exec(ch, fut, timeout)
        except asyncio.CancelledError:
            # The caller gave up; the container is free again once the runner answers.
            fut.add_done_callback(lambda f: self._io.call_soon(self._release, ch))
            raise
        self._release(ch)
        return result

    async def _exec(
        self, ch: _Channel, msg_or_fut: dict[str, Any] | concurrent.futures.Future[Any], timeout: float
    ) -> ExecResult:
        """The result of a stateless call (sent now if given as a message)."""
        fut = self._send(ch, msg_or_fut) if isinstance(msg_or_fut, dict) else msg_or_fut
        try:
            reply = await self._await_reply(ch, fut, timeout)
        except _Hung:
            return ExecResult(
                error=f"the sandbox did not answer within {timeout + _GUARD_S + _PING_S:g} s and was restarted",
                container=ch.short,
            )
        except _ChannelClosed:
            return ExecResult(error="the sandbox container died during the call and was restarted", container=ch.short)
        return ExecResult.from_reply(reply, ch.short)

    def _release(self, ch: _Channel) -> None:
        if not ch.closed and not self._closed and ch in self._channels:
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

    async def _open_session(self) -> SandboxSession:
        await self._start()
        ch = await self._place()
        family = _Family(ch)
        ch.families.add(family)  # counted now: the next concurrent open sees it
        sid = uuid.uuid4().hex[:12]
        try:
            reply = await self._await_reply(ch, self._send(ch, {"op": "open", "sid": sid, "limits": self._limits()}), _OPEN_S)
        except (_Hung, _ChannelClosed) as e:
            self._leave(family)
            raise SessionLost(f"container {ch.short} did not open a session: {e}") from e
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            self._leave(family)
            fail = reply.get("fail") if isinstance(reply, dict) else None
            raise SessionLost(fail if isinstance(fail, str) else "could not open a session")
        return SandboxSession(self, ch, sid, family=family)

    def _join(self, family: _Family) -> None:
        """A fork joins `family` (it holds its container's slot too). Pool loop."""
        family.members += 1

    def _leave(self, family: _Family) -> None:
        """One session of `family` is gone; the last one frees its container's slot. Pool loop."""
        family.members -= 1
        if family.members <= 0:
            family.channel.families.discard(family)
            self._notify()

    async def _shutdown(self) -> None:
        self._closed = True
        start, self._start_task = self._start_task, None
        if start is not None and not start.done():  # a start in flight removes what it made
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
        channels, self._channels = self._channels, []
        for ch in channels:
            ch.fail_all("the sandbox pool is closed")
        await asyncio.gather(*(ch.stop_reading() for ch in channels))
        if self._idle is not None:
            self._idle.put_nowait(None)
            self._broken = self._broken or ToolError("the sandbox pool is closed")
        self._notify()
        if self._closing is not None:
            self._closing.set()
        await self._blocking(self._remove_containers_blocking)
        if self._replacing:  # a container one was creating removes itself, seeing _closed: wait for it
            await asyncio.wait(list(self._replacing), timeout=self.config.docker_timeout_s)

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
    submitted and before any later one. A session whose container dies, or
    whose processes are killed, raises `SessionLost`: its variables are gone.
    """

    def __init__(
        self,
        pool: SandboxPool,
        channel: _Channel,
        sid: str,
        created: concurrent.futures.Future[Any] | None = None,
        *,
        family: _Family | None = None,
    ):
        self.pool = pool
        self.channel = channel
        self.sid = sid
        self._created = created  # the fork's reply, for sessions made by fork()
        self._family = family
        self.closed = False

    def _lost(self) -> None:
        if not self.closed:
            self.closed = True
            if self._family is not None:
                self.pool._io.call_soon(self.pool._leave, self._family)

    async def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        """Runs `code` as the session's next cell.

        Raises:
            SessionLost: the session's processes are gone; open a new one.
        """
        if self.closed:
            raise SessionLost("the session is closed")
        ch = self.channel
        timeout = call_timeout(timeout_s, self.pool.config)
        fut = self.pool._send(ch, self.pool._run_msg(code, timeout, self.sid))
        # A fork that has not happened yet delays the first call; allow for the parent's call too.
        budget = timeout + (self.pool.config.timeout_s if self._created is not None else 0.0)
        try:
            reply = await self.pool._await_reply(ch, fut, budget)
        except _ChannelClosed as e:
            self._lost()
            raise SessionLost(f"session lost: container {ch.short} died ({e}); its variables are gone") from e
        except _Hung as e:
            self._lost()
            raise SessionLost(
                f"session lost: container {ch.short} stopped answering and was replaced; its variables are gone"
            ) from e
        self._created = None
        result = ExecResult.from_reply(reply, ch.short)
        if not (isinstance(reply, dict) and reply.get("ok") is True):
            self._lost()
            raise SessionLost(result.error or "session lost")
        if result.session_lost:
            self._lost()
        return result

    def fork(self) -> SandboxSession:
        """An independent copy of this session's live state (same container, same uid). Does not block."""
        if self.closed:
            raise SessionLost("cannot fork a closed session")
        sid = uuid.uuid4().hex[:12]
        fut = self.pool._send(self.channel, {"op": "fork", "sid": self.sid, "new": sid})
        if self._family is not None:
            self.pool._io.call_soon(self.pool._join, self._family)  # in order with a later aclose's _leave
        return SandboxSession(self.pool, self.channel, sid, created=fut, family=self._family)

    async def aclose(self) -> None:
        """Kills the session's processes and frees its files."""
        if self.closed:
            return
        self._lost()
        if self.channel.closed:
            return
        fut = self.pool._send(self.channel, {"op": "close", "sid": self.sid})
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.wrap_future(fut), 10)
