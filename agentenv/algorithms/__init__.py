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
from typing import Any, cast

from agentenv.algorithms.base import Algorithm
from agentenv.algorithms.dynamic_sampling import DynamicSampling
from agentenv.errors import ConfigError
from agentenv.registry import Registry

_REQUIRED = ("config_cls", "sampler", "advantages", "loss")


def _missing(obj: Any) -> list[str]:
    """The required members `obj` lacks (for a subclass of `Algorithm`: does not define)."""
    if isinstance(obj, type) and issubclass(obj, Algorithm):
        return [m for m in _REQUIRED if getattr(obj, m, None) is getattr(Algorithm, m, None)]
    return [m for m in _REQUIRED if not hasattr(obj, m)]


def as_algorithm(obj: Any, key: str = "algorithm.name") -> type[Algorithm]:
    """`obj`, a class with the required members, as a subclass of `Algorithm`.

    A plugin written before the base class (or without it) gets the base's
    defaults for the hooks it does not define. Its constructor's argument is
    kept as `self.cfg` if the constructor does not set one; an old-style group
    filter (`keep_group`, with `max_resample_rounds` in its config) still runs
    dynamic sampling.
    """
    if issubclass(obj, Algorithm):
        return cast(type[Algorithm], obj)
    ns: dict[str, Any] = {"__module__": obj.__module__, "__qualname__": obj.__qualname__, "__doc__": obj.__doc__}
    own_init = obj.__init__

    def __init__(self: Any, cfg: Any = None, *args: Any, **kwargs: Any) -> None:
        own_init(self, cfg, *args, **kwargs)
        if "cfg" not in vars(self):
            self.cfg = cfg

    ns["__init__"] = __init__
    if hasattr(obj, "keep_group") and not hasattr(obj, "resample"):
        if not hasattr(obj, "max_resample_rounds"):
            ns["max_resample_rounds"] = lambda self: int(getattr(self.cfg, "max_resample_rounds", 0))

        def resample(self: Any, groups: Any, rollout: Any) -> Any:
            return DynamicSampling(self.keep_group, self.max_resample_rounds()).refill(groups, rollout)

        ns["resample"] = resample
    try:
        return cast(type[Algorithm], type(obj)(obj.__name__, (obj, Algorithm), ns))
    except TypeError as e:  # a metaclass or layout that cannot take the base
        raise ConfigError(key, f"{obj!r} cannot take agentenv.algorithms.base.Algorithm's defaults "
                          f"({e}): subclass it") from None


def _check(obj: Any, key: str) -> type[Algorithm]:
    missing = _missing(obj)
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
    if not isinstance(obj, type):  # the trainer calls the base's hooks on what it builds: a class is needed
        raise ConfigError(key, f"{obj!r} is not an algorithm class (subclass agentenv.algorithms.base.Algorithm)")
    return as_algorithm(obj, key)


_REGISTRY: Registry[type[Algorithm]] = Registry("algorithm", "algorithm.name", group="agentenv.algorithms", adapt=_check)


def register(name: str, algorithm: Any, *, overwrite: bool = False) -> None:
    """Register an Algorithm class (or a lazy `"module:Class"` string) under `name`."""
    _REGISTRY.register(name, algorithm, overwrite=overwrite)


def get_algorithm(name: str) -> type[Algorithm]:
    """The Algorithm class called `name` (registered, an entry point, or `module:Class`); unknown names list the known ones."""
    return _REGISTRY.get(name)


def available() -> list[str]:
    return _REGISTRY.names()


register("grpo", "agentenv.algorithms.grpo:GRPO")
register("arpo", "agentenv.algorithms.arpo:ARPO")
register("dapo", "agentenv.algorithms.dapo:DAPO")
register("reinforce_pp", "agentenv.algorithms.presets:ReinforcePP")  # presets: GRPO with another estimator
register("reinforce_pp_baseline", "agentenv.algorithms.presets:ReinforcePPBaseline")
register("rloo", "agentenv.algorithms.presets:RLOO")
register("gspo", "agentenv.algorithms.gspo:GSPO")
register("dr_grpo", "agentenv.algorithms.presets:DrGRPO")
register("gigpo", "agentenv.algorithms.gigpo:GiGPO")
register("arpo_gigpo", "agentenv.algorithms.gigpo:TreeGiGPO")  # GiGPO's step advantage on ARPO's trees

__all__ = ["Algorithm", "as_algorithm", "available", "get_algorithm", "register"]
