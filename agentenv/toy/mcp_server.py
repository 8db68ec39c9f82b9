"""A small MCP server for the toy tasks, written with the MCP SDK's server class: the example of `env.tools.mcp`.

    python -m agentenv.toy.mcp_server     # stdio; tools: python (arithmetic `print(...)` only)

Its one tool is named `python`, so the tiny model, which writes
`<python>print(6759 * 58134)</python>` in ARPO's tags format, calls it as it
would the sandbox (configs/toy_mcp_grpo.yaml, docs/guides/mcp.md).
"""

from __future__ import annotations

from agentenv.toy.agent import calculate


def main() -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("agentenv-toy-calc")

    @server.tool()
    def python(code: str) -> str:
        """Run `print(<arithmetic expression>)` and return what it prints (numbers and + - * / ( ) only)."""
        code = code.strip()
        expr = code[len("print(") : -1] if code.startswith("print(") and code.endswith(")") else code
        return calculate(expr)

    server.run("stdio")


if __name__ == "__main__":
    main()
