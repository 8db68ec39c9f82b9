"""`env.tools.mcp`: MCP servers as tools, in the shape of the `mcpServers` entries of common MCP client configs.

    env:
      tools:
        mcp:
          servers:
            time: {command: mcp-server-time, args: [--local-timezone, UTC]}
            notes: {command: python, args: [notes_server.py], env: {NOTES_DIR: /tmp/n}, stateful: true}
            remote: {url: "http://127.0.0.1:8000/mcp"}
          call_timeout_s: 30
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass, check_number


@dataclass(frozen=True)
class MCPServerConfig:
    """One MCP server: a command started over stdio, or a URL (streamable HTTP).

    Attributes:
        command: The program that runs the server (stdio transport), e.g. `mcp-server-time`, `python`, `npx`.
        args: Its arguments.
        env: Environment variables for it (added to the runner's PATH, HOME, ... as the MCP SDK does).
        cwd: Its working folder (None: the run's).
        url: A server reached over streamable HTTP instead (no `command`).
        headers: HTTP headers for `url` (e.g. an Authorization header).
        stateful: Its tools keep state between calls (a notebook, a file
            system): each episode gets its own server process, and ARPO's
            forks are refused (a process cannot be copied mid-episode).
            False (the default): one server serves every episode, and forks share it.
        tools: Expose only these tools of the server (None: all it lists).
        startup_timeout_s: Limit of starting the server and listing its tools.
    """

    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    stateful: bool = False
    tools: tuple[str, ...] | None = None
    startup_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ConfigError("command", f"give either command (a stdio server) or url (streamable HTTP), got "
                                         f"command={self.command!r} url={self.url!r}")  # fmt: skip
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError("url", f"must be an http(s) URL, got {self.url!r}")
        if self.command is not None and not self.command.strip():
            raise ConfigError("command", "must name a program, got ''")
        if not all(isinstance(v, str) for v in dict(self.env).values()):
            raise ConfigError("env", f"values must be strings, got {dict(self.env)!r}")
        check_number("startup_timeout_s", self.startup_timeout_s)


@dataclass(frozen=True)
class MCPConfig:
    """The `mcp` tool's options: the servers whose tools the env exposes, each under its own name.

    Attributes:
        servers: Server name -> `MCPServerConfig` (`{command, args, env}` or `{url}`).
        call_timeout_s: Limit of one tool call; a call past it is an error
            result the model reads, and the server is restarted.
        max_result_chars: Longest result text passed on (the env then cuts it to `env.max_result_tokens`).
    """

    servers: Mapping[str, Any] = field(default_factory=dict)
    call_timeout_s: float = 30.0
    max_result_chars: int = 20_000

    def __post_init__(self) -> None:
        if not isinstance(self.servers, Mapping) or not self.servers:
            raise ConfigError("servers", f"name at least one MCP server: servers: {{NAME: {{command: ...}}}}, got {self.servers!r}")
        built = {}
        for name, spec in self.servers.items():
            built[str(name)] = build_dataclass(MCPServerConfig, spec, f"servers.{name}")
        object.__setattr__(self, "servers", built)
        check_number("call_timeout_s", self.call_timeout_s)
        check_number("max_result_chars", self.max_result_chars, low=1, low_ok=True, integer=True)

    def unforkable(self) -> dict[str, str]:
        """Config key -> why, for each server that cannot follow an episode's fork (ARPO's tree)."""
        return {
            f"servers.{name}.stateful": f"MCP server {name!r} is stateful: its process cannot be copied at a branch point"
            for name, s in self.servers.items() if s.stateful
        }  # fmt: skip
