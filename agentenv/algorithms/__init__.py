"""Algorithms as plugins, selected by `algorithm.name` in a config.

    from agentenv.algorithms import register, get_algorithm
    register("my_algo", "my_package.algo:MyAlgorithm")

An algorithm is a sampler (how a Group is grown), an advantage estimator and a
loss; see `agentenv.algorithms.base.Algorithm`.
"""

from __future__ import annotations

from typing import Any

from agentenv.registry import Registry

_REGISTRY: Registry[Any] = Registry("algorithm", "algorithm.name")


def register(name: str, algorithm: Any, *, overwrite: bool = False) -> None:
    """Register an Algorithm class (or a lazy `"module:Class"` string) under `name`."""
    _REGISTRY.register(name, algorithm, overwrite=overwrite)


def get_algorithm(name: str) -> Any:
    """The Algorithm class registered as `name`; unknown names list the known ones."""
    return _REGISTRY.get(name)


def available() -> list[str]:
    return _REGISTRY.names()


register("grpo", "agentenv.algorithms.grpo:GRPO")
register("arpo", "agentenv.algorithms.arpo:ARPO")

__all__ = ["available", "get_algorithm", "register"]
