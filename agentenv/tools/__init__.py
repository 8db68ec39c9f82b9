"""Tools: plain async services (python sandbox, search, browser). No RL inside."""

from agentenv.tools.base import Tool
from agentenv.types import ToolResult

__all__ = ["Tool", "ToolResult"]
