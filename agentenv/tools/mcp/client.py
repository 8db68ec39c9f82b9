"""MCP servers as agentenv tools: each server's tools, listed at start, under their own names.

Sessions live on an event loop of their own (a daemon thread, `MCPHub`), so a
tool call can come from any loop (the tool loop, a synchronous `env.step`) and
the MCP SDK's sessions stay on the task that opened them. Per call:

- the call's text is turned into the tool's arguments: a tool with one
  parameter gets the text (as its JSON type: `"3"` for an integer is 3); one
  with several gets a JSON object (as the hermes format writes it);
- malformed arguments, an error the tool reports, and a call past
  `call_timeout_s` are results the model reads (`ok=False`), never exceptions;
- a server that died or hung is restarted, and the call that found it so gets
  an error result saying so. Only transport evidence counts: the session ended,
  a call ran past its limit, or a ping sent after a call failed fails (a slow
  ping is a busy server, not a dead one). An error's words never do (a tool's
  "connection closed" is its own error; restarting the shared server for it
  killed other episodes' calls);
- schemas are taken as JSON Schema allows: a boolean sub-schema (`true`: any
  value) is a value passed as the model wrote it; a tool whose schema nests
  deeper than `MAX_SCHEMA_DEPTH` is refused when the servers start, by name.

Every server process carries the tool set's reaper tag (`agentenv._reaper`):
what a server starts is ended when the server stops (it may exit cleanly and
leave children), and everything when the run ends, by SIGKILL too.

A stateless server (the default) is one process for every episode: `fork()`
returns the tool itself. A stateful one (`stateful: true`) gets a process per
episode: the env forks each prototype at `reset`, and the tools of one server
forked together (one `reset`) share that episode's process; `fork()` of an
episode's tool (ARPO's branch) raises ToolError, as a process cannot be copied.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from contextlib import AsyncExitStack
from typing import Any, cast

from agentenv._reaper import TAG_VAR, Reaper, end_tagged
from agentenv.errors import ConfigError, ToolError
from agentenv.tools.mcp.config import MCPConfig, MCPServerConfig
from agentenv.types import ToolErrorKind, ToolResult

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
SERVER_VAR = "AGENTENV_MCP_SERVER"
"""Environment variable naming the server process a process was started under (its children inherit it)."""
MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of a tool's input schema a server may list (a 400-deep one is refused at start, by name)."""
_PING_TIMEOUT_S = 10.0
"""How long the ping sent after a failed call is waited for (a ping that fails says the server is gone; one
still unanswered then says nothing: the server is busy)."""
_DROPPED_GRACE_S = 2.0
"""How long a listing may still answer after a message the client could not parse (most likely the listing
itself, which then never comes)."""


class MCPHub:
    """A daemon thread running one event loop that holds MCP sessions."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="agentenv-mcp", daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout_s: float | None) -> Any:
        """Run a coroutine on the hub from synchronous code."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    async def call(self, coro: Any) -> Any:
        """Await a coroutine on the hub from any other loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class ServerProcess:
    """One connection to one MCP server (one process for stdio), held by a task on the hub's loop.

    `restarts` counts the times it was started again after dying or hanging.
    """

    def __init__(self, name: str, config: MCPServerConfig, hub: MCPHub, tag: str | None = None):
        self.name = name
        self.config = config
        self.hub = hub
        self.tag = tag  # the tool set's reaper tag: the process and its children end with the run
        self.uid = uuid.uuid4().hex  # marks this server's process and its children (SERVER_VAR)
        self.session: Any = None
        self.restarts = 0
        self._stop: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self.generation = 0  # starts so far: a failed call restarts only the session it used
        self.transport_error: Exception | None = None  # the last message the client could not parse, if any
        self._dropped: asyncio.Event | None = None  # set when such a message arrives

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                if self.config.url is not None:
                    import httpx
                    from mcp.client.streamable_http import streamable_http_client

                    http = await stack.enter_async_context(httpx.AsyncClient(headers=dict(self.config.headers)))
                    streams = await stack.enter_async_context(streamable_http_client(self.config.url, http_client=http))  # type: ignore[arg-type]  # mcp's stubs name httpx2's client; it takes httpx's
                    read, write = streams[0], streams[1]
                else:
                    from mcp import StdioServerParameters
                    from mcp.client.stdio import stdio_client

                    command = cast(str, self.config.command)  # no url: the config requires a command
                    env = {**_base_env(), **dict(self.config.env), SERVER_VAR: self.uid}
                    if self.tag is not None:
                        env[TAG_VAR] = self.tag
                    params = StdioServerParameters(command=command, args=list(self.config.args), env=env,
                                                   cwd=self.config.cwd)  # fmt: skip
                    errlog = stack.enter_context(open(os.devnull, "w"))
                    read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
                session = await stack.enter_async_context(ClientSession(read, write, message_handler=self._on_message))
                await session.initialize()
                self.session = session
                if not ready.done():
                    ready.set_result(None)
                await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported to whoever waits on `ready`
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.session = None

    async def _on_message(self, message: Any) -> None:
        """The session's notifications and transport errors: keep the last error (a message the SDK could not
        parse and dropped, so the request it answered waits until its limit)."""
        if isinstance(message, Exception):
            self.transport_error = message
            if self._dropped is not None:
                self._dropped.set()
        await asyncio.sleep(0)

    async def start(self) -> None:
        """Start the server and open its session (on the hub's loop)."""
        self.generation += 1
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._holder = asyncio.ensure_future(self._hold(ready))
        try:
            await asyncio.wait_for(ready, self.config.startup_timeout_s)
        except Exception as e:
            await self.stop()
            what = f"url {self.config.url}" if self.config.url else f"command {self.config.command!r}"
            why = (f"no answer to the MCP handshake within startup_timeout_s={self.config.startup_timeout_s:g} s"
                   if isinstance(e, TimeoutError) else f"{type(e).__name__}: {_cause(e)}")  # fmt: skip
            raise ToolError(f"MCP server {self.name!r} ({what}) did not start: {why}") from e

    async def stop(self) -> None:
        holder, self._holder = self._holder, None
        if holder is None:
            return
        if self._stop is not None:
            self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(holder), 5.0)
        except BaseException:  # noqa: BLE001 - a stuck or dead session: cancel it
            holder.cancel()
            try:
                await holder
            except BaseException:  # noqa: BLE001 - the cancelled session's own error: it is going anyway
                pass
        if self.config.command is not None:  # what the server started (and the server, if it lingers) ends with it
            await asyncio.to_thread(end_tagged, self.uid, SERVER_VAR)

    async def restart(self) -> None:
        await self.stop()
        self.restarts += 1
        await self.start()

    async def list_tools(self) -> list[Any]:
        """The server's tools. A message the client cannot parse while it lists them is most likely the listing,
        which the SDK drops (so the request would wait out its limit): after one, the listing has
        `_DROPPED_GRACE_S` more, then fails naming the parse error."""
        self._dropped = asyncio.Event()
        listing = asyncio.ensure_future(self.session.list_tools())
        dropped = asyncio.ensure_future(self._dropped.wait())
        try:
            await asyncio.wait({listing, dropped}, return_when=asyncio.FIRST_COMPLETED)
            if not listing.done():
                await asyncio.wait({listing}, timeout=_DROPPED_GRACE_S)
            if not listing.done():
                e = cast(Exception, self.transport_error)
                raise ToolError("listing its tools failed: the MCP client could not parse a message from the server "
                                f"and dropped it ({type(e).__name__}: {_cause(e).splitlines()[0]}): "
                                "a tool schema nested too deep for its parser does this")  # fmt: skip
            return list(listing.result().tools)
        finally:
            listing.cancel()
            dropped.cancel()

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        """Call a tool; every failure is a result (a dead or hung server is restarted first)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        t0 = time.perf_counter()
        if self.session is None or self._holder is None or self._holder.done():
            try:
                async with self._lock:
                    if self.session is None or self._holder is None or self._holder.done():
                        await (self.restart() if self._holder is not None else self.start())
            except ToolError as e:
                return _failed(f"Error: the {tool} tool is unavailable: {e}", "server_down", t0, "error")
        used = self.generation
        try:
            res = await asyncio.wait_for(self.session.call_tool(tool, arguments), timeout_s)
        except TimeoutError:
            await self._recover(used)
            return _failed(f"Error: the {tool} call timed out after {timeout_s:g} s (the server was restarted).",
                           "timeout", t0, "timeout")  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a closed connection, a dead process, a protocol error
            if await self._gone(used):
                await self._recover(used)
                return _failed(f"Error: the {self.name} MCP server failed during the {tool} call "
                               f"({type(e).__name__}: {_cause(e)}); it was restarted.", "server_died", t0, "error")  # fmt: skip
            return _failed(f"Error: {tool}: {_cause(e)}", "mcp_error", t0, "error")
        return _as_result(res, time.perf_counter() - t0)

    async def _gone(self, used: int) -> bool:
        """Whether the session a failed call used is gone: ended, replaced, or no longer answering a ping.

        Transport evidence only: the failed call's message is never read (a tool
        may say "connection closed" about its own upstream).
        """
        if self._holder is None or self._holder.done() or self.generation != used or self.session is None:
            return True
        try:
            await asyncio.wait_for(self.session.send_ping(), min(_PING_TIMEOUT_S, self.config.startup_timeout_s))
        except TimeoutError:  # no evidence: it answered the failed call a moment ago and is busy (another
            return False  # episode's call); a hung server meets its calls' limit (`call_timeout_s`) and restarts
        except Exception:  # noqa: BLE001 - the ping failed: the connection is gone
            return True
        return False

    async def _recover(self, used: int) -> None:
        """Restart the server, unless a concurrent call already restarted the session this one used."""
        assert self._lock is not None
        async with self._lock:
            if self.generation != used:
                return
            try:
                await self.restart()
            except ToolError:
                pass  # the next call tries again and reports it


def _base_env() -> dict[str, str]:
    from mcp.client.stdio import get_default_environment

    return get_default_environment()


def _cause(e: BaseException) -> str:
    """The innermost message of an exception group (anyio wraps what a task group raised)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return str(e) or type(e).__name__


def _failed(text: str, error: str, t0: float, kind: ToolErrorKind) -> ToolResult:
    return ToolResult(text=text, ok=False, error=error, latency_s=time.perf_counter() - t0, kind=kind)


def _as_result(res: Any, latency: float) -> ToolResult:
    parts = []
    for c in getattr(res, "content", None) or []:
        kind = getattr(c, "type", "")
        if kind == "text":
            parts.append(c.text)
        elif kind == "resource" and getattr(c.resource, "text", None) is not None:
            parts.append(c.resource.text)
        else:
            parts.append(f"[{kind} content]")
    structured = getattr(res, "structured_content", None) or getattr(res, "structuredContent", None)
    text = "\n".join(parts) if parts else (json.dumps(structured, ensure_ascii=False) if structured is not None else "")
    is_error = bool(getattr(res, "is_error", None) or getattr(res, "isError", None))
    if is_error:
        # the server ran the tool and the tool reported an error (bad input, a failed computation): the agent's
        return ToolResult(text=f"Error: {text}", ok=False, error="tool_error", latency_s=latency, kind="agent")
    return ToolResult(text=text, ok=True, latency_s=latency)


# --------------------------------------------------------------------------- arguments
def _coerce(value: str, schema: Any) -> Any:
    if schema is False:
        raise ValueError("its schema accepts no value")
    if not isinstance(schema, dict):  # `true` (JSON Schema: any value) or anything else that is no object schema
        return value
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    text = value.strip()
    if kind == "integer":
        return int(text)
    if kind == "number":
        return float(text)
    if kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError("must be true or false")
        return text.lower() == "true"
    if kind in ("object", "array"):
        return json.loads(text)
    return value


def arguments_of(query: str, schema: dict[str, Any], tool: str) -> dict[str, Any]:
    """The arguments of a call from its text (see the module docstring).

    Raises:
        ValueError: A message the model can read.
    """
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    if len(props) == 1:
        (name,) = props
        stripped = query.strip()
        if stripped.startswith("{"):  # the JSON object itself (the tags format, or a model that writes one)
            try:
                obj = json.loads(stripped)
                if isinstance(obj, dict) and set(obj) <= {name}:
                    return obj
            except json.JSONDecodeError:
                pass
        try:
            return {name: _coerce(query, props[name])}
        except (ValueError, json.JSONDecodeError) as e:
            kind = props[name].get("type", "text") if isinstance(props[name], dict) else "text"
            raise ValueError(f"{tool}'s argument {name!r} must be {kind}: {e}") from None
    if not props:
        return {}
    try:
        obj = json.loads(query)
    except json.JSONDecodeError as e:
        raise ValueError(f"{tool} takes a JSON object of its arguments ({', '.join(props)}): {e.msg}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{tool} takes a JSON object of its arguments ({', '.join(props)})")
    required = schema.get("required")
    missing = [k for k in (required if isinstance(required, list) else []) if k not in obj]
    if missing:
        raise ValueError(f"{tool} needs the argument {missing[0]!r}")
    return obj


# --------------------------------------------------------------------------- tools
class _Episodes:
    """Hands out a stateful server's per-episode processes: the tools forked by one `reset` share one."""

    def __init__(self, name: str, config: MCPServerConfig, hub: MCPHub, tool_names: list[str], tag: str | None):
        self.name, self.config, self.hub, self.tag = name, config, hub, tag
        self.tool_names = set(tool_names)
        self._open: dict[Any, tuple[ServerProcess, set[str]]] = {}

    def for_fork(self, tool: str) -> SharedProcess:
        try:
            key = id(asyncio.current_task())
        except RuntimeError:
            key = None
        held = self._open.get(key)
        if held is None or tool in held[1]:
            held = (ServerProcess(self.name, self.config, self.hub, self.tag), set())
            self._open[key] = held
        held[1].add(tool)
        shared = SharedProcess.of(held[0])
        if held[1] >= self.tool_names:
            self._open.pop(key, None)
        return shared


class SharedProcess:
    """A per-episode server process and how many of the episode's tools still use it."""

    _by_process: dict[int, SharedProcess] = {}

    def __init__(self, process: ServerProcess):
        self.process = process
        self.users = 0

    @classmethod
    def of(cls, process: ServerProcess) -> SharedProcess:
        shared = cls._by_process.setdefault(id(process), cls(process))
        shared.users += 1
        return shared

    async def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self._by_process.pop(id(self.process), None)
            await self.process.hub.call(self.process.stop())


class MCPTool:
    """One tool of one MCP server, as an agentenv `Tool` (name, description and schema from the server).

    Prototypes are made by `make_mcp_tools`; an episode's copy comes from `fork()`.
    `server` names its server (`FromServer`).
    """

    def __init__(self, name: str, description: str, schema: dict[str, Any], server: str, owner: MCPToolSet,
                 process: ServerProcess | None, episodes: _Episodes | None = None):  # fmt: skip
        self.name = name
        self.description = description
        self.schema = schema
        self.server = server
        self.owner = owner
        self._process = process  # stateless: the shared process; stateful: this episode's (None for a prototype)
        self._episodes = episodes
        self._shared: SharedProcess | None = None
        self._closed = False

    @property
    def stateful(self) -> bool:
        return self._episodes is not None

    async def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        try:
            args = arguments_of(query, self.schema, self.name)
        except ValueError as e:
            return _failed(f"Error: {e}", "bad_arguments", t0, "refused")
        process = self._process
        if process is None:
            raise ToolError(f"{self.name}: a stateful MCP tool's prototype is not called; an episode forks it first")
        text_cap = self.owner.config.max_result_chars
        result: ToolResult = await self.owner.hub.call(process.call(self.name, args, self.owner.config.call_timeout_s))
        if len(result.text) > text_cap:
            result.text = result.text[:text_cap]
        return result

    def fork(self) -> MCPTool:
        """Stateless: the tool itself. Stateful: a prototype's fork gets an episode process; an episode's cannot fork."""
        if self._episodes is None:
            return self
        if self._process is not None:
            raise ToolError(
                f"MCP tool {self.name!r} of the stateful server {self.server!r} cannot fork mid-episode (its "
                "process cannot be copied); ARPO's tree needs forks: use an independent-sampler algorithm, or set "
                f"env.tools.mcp.servers.{self.server}.stateful=false if its tools keep no state"
            )
        shared = self._episodes.for_fork(self.name)
        tool = MCPTool(self.name, self.description, self.schema, self.server, self.owner, shared.process, self._episodes)
        tool._shared = shared
        return tool

    async def aclose(self) -> None:
        """An episode's stateful tool: release its process (stopped with the episode's last tool). A prototype:
        the tool set closes when its last prototype does."""
        if self._closed:
            return
        self._closed = True
        if self._shared is not None:
            await self._shared.release()
        elif self._process is None or not self.stateful:
            await self.owner.release()


class MCPToolSet:
    """Every tool of the configured servers (built by `make_mcp_tools`); owns the hub and the shared processes."""

    def __init__(self, config: MCPConfig):
        self.config = config
        self.reaper = Reaper(tag=True)  # armed before any server starts: they and their children end with the run
        self.hub = MCPHub()
        self.processes: dict[str, ServerProcess] = {}
        self.tools: list[MCPTool] = []
        self._open = 0

    def start(self) -> list[MCPTool]:
        """Start each server, list its tools (a stateful server's first process only lists them)."""
        source: dict[str, str] = {}  # tool name -> the server that lists it
        for name, spec in self.config.servers.items():
            proc = ServerProcess(name, spec, self.hub, self.reaper.tag)
            try:
                self.hub.run(proc.start(), spec.startup_timeout_s + 10)
                listed = self.hub.run(proc.list_tools(), spec.startup_timeout_s)
            except ToolError as e:
                raise ConfigError(f"env.tools.mcp.servers.{name}", str(e)) from None
            except Exception as e:  # noqa: BLE001 - listing failed: say which server
                why = f"{type(e).__name__}: {_cause(e)}"
                if isinstance(e, TimeoutError):
                    why = f"no answer within startup_timeout_s={spec.startup_timeout_s:g} s"
                raise ConfigError(f"env.tools.mcp.servers.{name}", f"listing its tools failed: {why}") from None
            wanted = set(spec.tools) if spec.tools is not None else None
            chosen = [t for t in listed if wanted is None or t.name in wanted]
            if wanted is not None and wanted - {t.name for t in listed}:
                raise ConfigError(f"env.tools.mcp.servers.{name}.tools", f"{sorted(wanted - {t.name for t in listed})} "
                                  f"not among the server's tools: {', '.join(t.name for t in listed)}")  # fmt: skip
            episodes = None
            if spec.stateful:
                self.hub.run(proc.stop(), 10)  # the listing process; episodes get their own
                episodes = _Episodes(name, spec, self.hub, [t.name for t in chosen], self.reaper.tag)
            else:
                self.processes[name] = proc
            for t in chosen:
                key = f"env.tools.mcp.servers.{name}"
                if not t.name or not set(t.name) <= _NAME_CHARS:
                    raise ConfigError(key, f"tool name {t.name!r} cannot be a tool tag")
                if t.name in source:
                    raise ConfigError(key, f"lists a tool named {t.name!r}, and so does env.tools.mcp.servers."
                                           f"{source[t.name]}: tool names must be unique (the model calls a tool by "
                                           "its name); expose only some of one server's tools (its `tools` list)")  # fmt: skip
                source[t.name] = name
                raw = t.input_schema if hasattr(t, "input_schema") else t.inputSchema
                schema = dict(raw) if isinstance(raw, dict) and raw else {"type": "object"}
                depth = schema_depth(schema)
                if depth > MAX_SCHEMA_DEPTH:
                    raise ConfigError(key, f"tool {t.name!r} has an input schema nested {depth} deep (at most "
                                           f"{MAX_SCHEMA_DEPTH}): no model can be shown it; drop the tool from the "
                                           "server's `tools` list")  # fmt: skip
                self.tools.append(MCPTool(t.name, t.description or f"The {t.name} tool of the {name} MCP server.",
                                          schema, name, self, None if spec.stateful else proc, episodes))  # fmt: skip
        self._open = len(self.tools)
        return list(self.tools)

    async def release(self) -> None:
        self._open -= 1
        if self._open <= 0:
            await self.aclose()

    async def aclose_servers(self) -> None:
        """Stop the shared processes (on the hub's loop)."""
        procs, self.processes = list(self.processes.values()), {}
        for p in procs:
            try:
                await p.stop()
            except Exception:  # noqa: BLE001 - closing: the others go anyway
                pass

    async def aclose(self) -> None:
        await self.hub.call(self.aclose_servers())
        self.hub.stop()
        await asyncio.to_thread(self.reaper.release)  # what the servers left behind


def schema_depth(schema: Any) -> int:
    """How deep a JSON value nests (objects and arrays), counted without recursion."""
    deepest, stack = 0, [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def make_mcp_tools(config: MCPConfig) -> list[MCPTool]:
    """The `mcp` tool's factory: the prototypes of every tool of every configured server.

    Raises:
        ConfigError: A server did not start or list its tools, two servers list one tool name, or a tool's
            schema cannot be shown; the servers already started are stopped first.
    """
    toolset = MCPToolSet(config)
    try:
        return toolset.start()
    except BaseException:
        toolset.hub.run(toolset.aclose_servers(), 30)
        toolset.hub.stop()
        toolset.reaper.release()
        raise
