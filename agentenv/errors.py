"""Errors by whose fault they are.

- The agent's mistakes (bad code, malformed tool call) never raise: they become
  a `ToolResult` the model reads.
- A user's misconfiguration raises `ConfigError`, naming the key and the value.
- Infrastructure faults raise `InfraError` (tools: `ToolError`) with a message
  that says how to fix them. They are retried where that is safe and never
  swallowed.
- A run that can no longer learn stops with `TrainingStopped` instead of
  finishing as if nothing were wrong.
"""

from __future__ import annotations


class AgentEnvError(Exception):
    """Base class of every error agentenv raises on purpose."""


class ConfigError(AgentEnvError, ValueError):
    """A configuration value is invalid. The message names the key and the value."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class InfraError(AgentEnvError, RuntimeError):
    """Something the run depends on is broken (daemon gone, server down, disk full)."""


class ToolError(InfraError):
    """A tool's infrastructure failed (not the agent's mistake). Says how to fix it."""


class TrainingStopped(AgentEnvError, RuntimeError):
    """The run stopped because it could no longer learn: every trajectory of several steps
    failed, or the loss, gradients or weights stopped being finite. Says why and what to change."""
