"""The Tool protocol: a plain async service, text in, text out. No RL inside."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentenv.types import ToolResult


@runtime_checkable
class Tool(Protocol):
    """A tool the agent calls with a tag named after it (`<name>query</name>`).

    A tool never raises for the agent's mistakes (bad code, empty query): those
    become a `ToolResult` with `ok=False` the model can read. Infrastructure
    faults raise `agentenv.errors.ToolError` with a message that says how to fix
    them.

    Lifecycle: an `AgentEnv` is given prototype tools. At `reset` it calls
    `fork()` on each prototype to get the episode's own tool (a stateful tool's
    prototype has empty state, so its fork is a fresh session); at a branch
    point `AgentEnv.fork()` forks the episode's tools; when an episode ends the
    env calls `aclose()` on the episode's tools. Whoever built the prototype
    closes it (and any shared pool behind it).
    """

    name: str

    async def __call__(self, query: str) -> ToolResult: ...

    def fork(self) -> "Tool":
        """An independent copy of the tool's state. A stateless tool may return itself."""
        ...

    async def aclose(self) -> None: ...
