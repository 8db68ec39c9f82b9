"""Trajectory-level advantage estimators by name, so that a sampler composes with any of them by config.

An estimator turns the rewards of one group's valid trajectories, (G,), into
one advantage each, (G,), and may add a batch-level step that a group cannot do
alone (REINFORCE++: the KL penalty folded into the token-level return, then
advantages whitened over the global batch). GRPO, Dr. GRPO, RLOO and
REINFORCE++ use theirs; ARPO takes any of them (`algorithm.estimator`):

    algorithm: {name: arpo, estimator: rloo}
    algorithm: {name: arpo, estimator: reinforce_pp, kl_coef: 0.01}

Each entry lives in its algorithm's package and is imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from agentenv.errors import ConfigError
from agentenv.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from agentenv.algorithms.base import Reduce, TrainBatch
    from agentenv.types import Group


@dataclass(frozen=True)
class Estimator:
    """A named advantage estimator.

    Attributes:
        scalars: (G,) rewards of a group's valid trajectories -> (G,) advantages;
            it must accept G = 1 (a group with one valid trajectory).
        batch_step: Optional `batch_step(batch, reduce, cfg) -> metrics`, run by the
            algorithm's `finalize` on every process: it rewrites `batch.advantages`
            (per token) using the whole batch (`reduce` sums over processes) and
            `cfg` (the algorithm's config: `kl_coef`, `normalize_std`).
        kl_in_return: The batch step folds the KL penalty into the return, so the
            loss adds no KL term of its own.
    """

    scalars: Callable[[torch.Tensor], torch.Tensor]
    batch_step: Callable[["TrainBatch", "Reduce", Any], dict[str, float]] | None = None
    kl_in_return: bool = False


def _check(obj: Any, key: str) -> Estimator:
    if not isinstance(obj, Estimator):
        raise ConfigError(key, f"{obj!r} is not an advantage estimator (agentenv.algorithms.estimators.Estimator)")
    return obj


_REGISTRY: Registry[Estimator] = Registry(
    "advantage estimator", "algorithm.estimator", group="agentenv.estimators", adapt=_check
)


def register(name: str, estimator: Estimator | str, *, overwrite: bool = False) -> None:
    """Register an Estimator (or a lazy `"module:attr"` string) under `name`."""
    _REGISTRY.register(name, estimator, overwrite=overwrite)


def get_estimator(name: str, key: str = "algorithm.estimator") -> Estimator:
    """The estimator called `name`; an unknown name raises a ConfigError naming `key` and the closest names."""
    return _REGISTRY.get(name, key)


def available() -> list[str]:
    return _REGISTRY.names()


register("grpo", "agentenv.algorithms.grpo.loss:GRPO_ESTIMATOR")  # (r - mean) / std, per group
register("dr_grpo", "agentenv.algorithms.dr_grpo.loss:DR_GRPO_ESTIMATOR")  # r - mean
register("rloo", "agentenv.algorithms.rloo.loss:RLOO_ESTIMATOR")  # r_i - mean_{j != i} r_j
register("reinforce_pp", "agentenv.algorithms.reinforce_pp.loss:REINFORCE_PP_ESTIMATOR")  # r; KL-in-return, global whitening
register("reinforce_pp_baseline", "agentenv.algorithms.reinforce_pp.loss:REINFORCE_PP_BASELINE_ESTIMATOR")


def valid_advantages(rewards: Sequence[float], valid: Sequence[bool], scalars: Callable[[torch.Tensor], torch.Tensor]) -> list[float]:
    """One advantage per trajectory from `scalars` over the valid ones; invalid (failed) ones get 0
    and do not move the group's statistics."""
    ok = [i for i, v in enumerate(valid) if v]
    out = [0.0] * len(rewards)
    if not ok:
        return out
    adv = scalars(torch.tensor([float(rewards[i]) for i in ok], dtype=torch.float64))  # (G_valid,)
    for i, a in zip(ok, adv.tolist()):
        out[i] = a
    return out


def group_scalars(group: "Group", scalars: Callable[[torch.Tensor], torch.Tensor]) -> list[float]:
    """`valid_advantages` over a group's rewards, failed trajectories left out."""
    trajs = group.trajectories
    return valid_advantages([t.reward for t in trajs], [not t.failed for t in trajs], scalars)
