"""MCP servers as tools (`env.tools: {mcp: {servers: {NAME: {command, args, env} | {url}}}}`); the `mcp` package
is imported only when a config names them."""
