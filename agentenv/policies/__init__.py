"""Policies: the Policy protocol, its backends (hf, vllm, scripted) and models by name. Backends load lazily.

A leaf: runs no env and no rollout. The policy backends (`backends.py`) and
models (`models.py`) a config names are registries.
"""

from agentenv.policies.base import Policy

__all__ = ["Policy"]
