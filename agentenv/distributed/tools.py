"""A tool served by a Ray actor on the node that has its resources, and its proxy in the trainer.

`ToolService` builds the tool (a sandbox pool, a retriever, a browser) in its
own process and keeps its sessions by id: the prototype is `proto`, every fork
a new id. `RemoteTool` is the `Tool` the env holds: a call goes to the actor,
a fork names the child session and tells the actor without waiting for it, a
close ends the session there. An actor that dies turns the calls it held, and
those of its lost sessions, into `ToolError`s (infrastructure faults: the
trajectory fails and the tool's tally says so); Ray restarts it, and new
episodes use the fresh prototype.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from agentenv.errors import ToolError
from agentenv.tools.base import HealthChecked, description_of, schema_of
from agentenv.types import ToolResult

PROTO = "proto"
_FORK_WAIT_S = 5.0
"""How long a call waits for its session's fork to arrive (forks are sent without waiting)."""


class ToolService:
    """The tool's sessions, in the actor's process.

    Args:
        make_tool: Builds the prototype tool (picklable, zero arguments).
    """

    def __init__(self, make_tool: Callable[[], Any]):
        self.proto = make_tool()
        self.sessions: dict[str, Any] = {PROTO: self.proto}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.proto.name,
            "description": description_of(self.proto),
            "schema": schema_of(self.proto),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    async def _session(self, sid: str) -> Any:
        waited = 0.0
        while sid not in self.sessions:
            if waited >= _FORK_WAIT_S:
                raise ToolError(f"{self.proto.name} session {sid} is lost: its tool service was restarted")
            await asyncio.sleep(0.01)
            waited += 0.01
        return self.sessions[sid]

    async def fork(self, parent: str, child: str) -> None:
        self.sessions[child] = (await self._session(parent)).fork()

    async def call(self, sid: str, query: str) -> ToolResult:
        tool = await self._session(sid)
        result: ToolResult = await tool(query)
        return result

    async def close(self, sid: str) -> None:
        tool = self.sessions.pop(sid, None)
        if tool is not None and tool is not self.proto and not any(t is tool for t in self.sessions.values()):
            await tool.aclose()

    async def health_check(self) -> None:
        if isinstance(self.proto, HealthChecked):
            await self.proto.health_check()

    async def shutdown(self) -> None:
        """Close every session and the prototype (a sandbox pool removes its containers)."""
        for sid in [s for s in self.sessions if s != PROTO]:
            await self.close(sid)
        await self.proto.aclose()


class RemoteTool:
    """The trainer's side of a `ToolService`: a `Tool` over one of its sessions.

    Args:
        actor: The `ToolService` actor.
        description: What the service's tool reports (`name`, `description`, `schema`).
        sid: The session (`proto` for the prototype).
        owner: This process started the actor: closing the prototype ends it.
    """

    def __init__(self, actor: Any, description: dict[str, Any], sid: str = PROTO, *, owner: bool = True):
        self.actor = actor
        self._description = description
        self.name: str = description["name"]
        self.description = description.get("description")
        self.schema = description.get("schema")
        self.sid = sid
        self.owner = owner

    def _died(self, e: BaseException) -> ToolError:
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return ToolError(f"the {self.name} tool service died ({line}); Ray restarts it")

    async def __call__(self, query: str) -> ToolResult:
        try:
            result: ToolResult = await self.actor.call.remote(self.sid, query)
            return result
        except RayActorError as e:
            raise self._died(e) from None

    def fork(self) -> RemoteTool:
        child = uuid.uuid4().hex
        self.actor.fork.remote(self.sid, child)  # not awaited: the child's first call waits for it there
        return RemoteTool(self.actor, self._description, child, owner=False)

    async def health_check(self) -> None:
        try:
            await self.actor.health_check.remote()
        except RayActorError as e:
            raise self._died(e) from None

    async def aclose(self) -> None:
        try:
            if self.sid != PROTO:
                await self.actor.close.remote(self.sid)
            elif self.owner:
                await self.actor.shutdown.remote()
        except RayActorError:
            pass  # a dead service holds no session
        finally:
            if self.sid == PROTO and self.owner:
                ray.kill(self.actor, no_restart=True)
