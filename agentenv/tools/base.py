"""The Tool protocol: a plain async service, text in, text out. No RL inside."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

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

    Optional attributes, for chat formats that describe tools to the model
    (`hermes`): `description` (what the tool does, `Described`) and `schema`
    (the JSON schema of its arguments, an object, `HasSchema`). A tool without
    them takes one string `query` (see `tool_schema`).

    Optional hook: `async health_check() -> None` (see `HealthChecked`), run on
    the prototype before a run's first step (`Runtime.health_check`): it warms
    what the tool needs (a sandbox pool's containers, a retriever's index) and
    raises `ToolError` when the tool cannot answer. A tool without it is fine:
    there is nothing to warm. It is not a member of this Protocol, so
    `isinstance(x, Tool)` does not ask for it.
    """

    name: str

    async def __call__(self, query: str) -> ToolResult: ...

    def fork(self) -> Tool:
        """An independent copy of the tool's state. A stateless tool may return itself."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class HealthChecked(Protocol):
    """A tool's optional hook: warm up and prove it answers, or raise `ToolError` (see `Tool`)."""

    async def health_check(self) -> None: ...


@runtime_checkable
class FromServer(Protocol):
    """A tool one of a tool set's servers serves (an MCP tool): `server` is its name under the set's `servers`."""

    server: str


@runtime_checkable
class Described(Protocol):
    """A tool's optional text for the model: what it does (None: a generic line)."""

    description: str | None


@runtime_checkable
class HasSchema(Protocol):
    """A tool's optional JSON schema of its arguments, an object (None: one string `query`)."""

    schema: dict[str, Any] | None


@runtime_checkable
class ForkLimited(Protocol):
    """A tool config whose options can leave its tool unable to follow an episode's fork (ARPO's tree)."""

    def unforkable(self) -> dict[str, str]:
        """Config key -> why, for each option that keeps the tool from forking (empty: it forks)."""
        ...


def description_of(tool: object) -> str | None:
    """The tool's `description` (None when it declares none)."""
    return tool.description if isinstance(tool, Described) else None


def schema_of(tool: object) -> dict[str, Any] | None:
    """The tool's `schema` (None when it declares none)."""
    return tool.schema if isinstance(tool, HasSchema) else None


# --------------------------------------------------------------------------- schemas for chat formats
DEFAULT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "What to ask the tool."}},
    "required": ["query"],
}
"""The arguments of a tool that declares no `schema`: one string, its query."""


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The tool as a function schema (`{"type": "function", "function": {name, description, parameters}}`),
    what chat templates take as `tools`.

    A tool may declare `description` (what it does, for the model) and `schema`
    (the JSON schema of its arguments, an object); a tool without them is one
    that takes a string `query`.
    """
    description = description_of(tool) or f"The {tool.name} tool: give it a query, read its answer."
    parameters = schema_of(tool) or DEFAULT_PARAMETERS
    return {"type": "function", "function": {"name": tool.name, "description": description, "parameters": parameters}}


def query_from_arguments(tool: Tool, arguments: Mapping[str, Any]) -> str:
    """The query a tool is called with, from a call's JSON arguments.

    A tool whose schema has one parameter gets that argument's value (a number
    as its text); a tool with several gets the arguments as a JSON object (it
    parses them, as `browse` does).

    Raises:
        ValueError: A required argument is missing or the one argument is not text
            (a message the model can read).
    """
    schema = tool_schema(tool)["function"]["parameters"]
    parameters, required = schema.get("properties") or {}, schema.get("required") or []
    missing = [k for k in required if k not in arguments]
    if missing:
        raise ValueError(f"{tool.name} needs the argument {missing[0]!r} (its arguments: {', '.join(parameters) or 'none'})")
    if len(parameters) == 1:
        (name,) = parameters
        value = arguments.get(name, "")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"{tool.name}'s argument {name!r} must be a string, got {json.dumps(value)}")
        return str(value)
    return json.dumps(dict(arguments), ensure_ascii=False)
