"""An MCP server written with the SDK's server class (`MCPServer`, FastMCP's name in mcp 2.x), run over stdio.

    python calc_server.py [--http PORT]   # stdio, or streamable HTTP on 127.0.0.1

Tools: add, divide, crash, wait, remember/recall (state kept in the process).
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")
_notes: list[str] = []


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b  # b == 0 raises: the server reports it as a tool error


@server.tool()
def crash(reason: str) -> str:
    """Exit the server process after a moment, holding up the calls behind it (a server that dies mid-episode)."""
    time.sleep(0.3)
    os._exit(3)


@server.tool()
def wait(seconds: float) -> str:
    """Answer after `seconds`."""
    time.sleep(seconds)
    return "waited"


@server.tool()
def remember(note: str) -> str:
    """Keep a note in this process."""
    _notes.append(note)
    return f"{len(_notes)} notes"


@server.tool()
def recall(prefix: str) -> str:
    """The notes kept so far that start with `prefix`, and this process's id."""
    return f"pid {os.getpid()}: " + ", ".join(n for n in _notes if n.startswith(prefix))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":  # streamable HTTP on 127.0.0.1:PORT/mcp
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
