"""Tools: plain async services (python sandbox, search, browser). No RL inside."""

from agentenv.tools.base import HealthChecked, Tool
from agentenv.types import ToolResult

__all__ = ["HealthChecked", "Tool", "ToolResult"]
