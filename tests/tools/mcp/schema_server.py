"""An MCP server (the SDK's low-level `Server`) whose tool schemas are odd, huge or deep, and whose tools misbehave
in ways that are not a dead server, over stdio.

    python schema_server.py odd [NAME] | huge | deep [DEPTH]

- `odd`: `echo` takes `{"text": true}` (a boolean sub-schema: any value); `upstream` raises a protocol error whose
  message says "connection closed" (the server is fine); `spawn` starts a child process that outlives it unless
  reaped, and answers the child's pid; `wait` answers after a moment.
- `huge`: one tool whose schema is about 200 KB.
- `deep`: one tool whose schema nests DEPTH (400) levels deep.
NAME renames the `echo` tool.
"""

from __future__ import annotations

import subprocess
import sys

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

MODE = sys.argv[1]
ARG = sys.argv[2] if len(sys.argv) > 2 else None
ECHO = ARG or "echo"


def _deep(n: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _tools() -> list[types.Tool]:
    if MODE == "huge":
        props = {f"field_{i}": {"type": "string", "description": "x" * 190} for i in range(1000)}
        return [types.Tool(name="huge", description="A tool with a 200 KB schema.", input_schema={"type": "object", "properties": props})]
    if MODE == "deep":
        deep = {"type": "object", "properties": {"x": _deep(int(ARG or 400))}}
        return [types.Tool(name="deep", description="A tool with a deep schema.", input_schema=deep)]
    any_value = {"type": "object", "properties": {"text": True}}
    return [
        types.Tool(name=ECHO, description="Echo the text.", input_schema=any_value),
        types.Tool(name="upstream", description="Fails with a protocol error.", input_schema=any_value),
        types.Tool(name="spawn", description="Start a child process.", input_schema=any_value),
        types.Tool(name="wait", description="Answer after a second.", input_schema=any_value),
    ]


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=_tools())


async def call_tool(ctx, params) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "upstream":
        raise MCPError(code=-32000, message="upstream connection closed")
    if params.name == "spawn":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(child.pid))])
    if params.name == "wait":
        await anyio.sleep(1.5)
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"{params.name}: {args.get('text')!r}")])


server = Server("schemas", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
