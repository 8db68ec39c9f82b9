"""Algorithms as plugins, selected by `algorithm.name` in a config.

    from agentenv.algorithms import register, get_algorithm
    register("my_algo", "my_package.algo:MyAlgorithm")

or, with no registration, `algorithm.name: my_package.algo:MyAlgorithm`; an
installed package adds algorithms through the `agentenv.algorithms` entry-point
group. An algorithm is a sampler (how a Group is grown), an advantage
estimator, a loss and its token accounting; see `agentenv.algorithms.base.Algorithm`.
"""

from __future__ import annotations

import inspect
from typing import Any

from agentenv.errors import ConfigError
from agentenv.registry import Registry

_MEMBERS = ("config_cls", "sampler", "advantages", "loss", "generated_tokens")


def _check(obj: Any, key: str) -> Any:
    missing = [m for m in _MEMBERS if not hasattr(obj, m)]
    if missing:
        raise ConfigError(
            key, f"{obj!r} is not an algorithm: it lacks {', '.join(missing)} (see agentenv.algorithms.base.Algorithm)"
        )
    params = inspect.signature(obj.loss).parameters.values()
    if not any(p.name == "norm" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        raise ConfigError(
            key,
            f"{obj!r}: loss(batch, new_logprobs) must also take `norm`, the mini-batch's LossNorm, and divide by it: "
            "the trainer sums the micro-batch losses of a mini-batch (see agentenv.algorithms.base.Algorithm.loss)",
        )
    return obj


_REGISTRY: Registry[Any] = Registry("algorithm", "algorithm.name", group="agentenv.algorithms", adapt=_check)


def register(name: str, algorithm: Any, *, overwrite: bool = False) -> None:
    """Register an Algorithm class (or a lazy `"module:Class"` string) under `name`."""
    _REGISTRY.register(name, algorithm, overwrite=overwrite)


def get_algorithm(name: str) -> Any:
    """The Algorithm class called `name` (registered, an entry point, or `module:Class`); unknown names list the known ones."""
    return _REGISTRY.get(name)


def available() -> list[str]:
    return _REGISTRY.names()


register("grpo", "agentenv.algorithms.grpo:GRPO")
register("arpo", "agentenv.algorithms.arpo:ARPO")
register("dapo", "agentenv.algorithms.dapo:DAPO")
register("reinforce_pp", "agentenv.algorithms.reinforce_pp:ReinforcePP")
register("reinforce_pp_baseline", "agentenv.algorithms.reinforce_pp:ReinforcePPBaseline")
register("rloo", "agentenv.algorithms.rloo:RLOO")
register("gspo", "agentenv.algorithms.gspo:GSPO")
register("dr_grpo", "agentenv.algorithms.dr_grpo:DrGRPO")

__all__ = ["available", "get_algorithm", "register"]
