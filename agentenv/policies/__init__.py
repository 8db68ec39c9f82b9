"""Policies: the Policy protocol and its backends (hf, vllm, tiny). Backends load lazily."""

from agentenv.policies.base import Policy

__all__ = ["Policy"]
