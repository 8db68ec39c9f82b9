"""REINFORCE++ as an algorithm plugin: GRPO's sampler and clipped loss, the KL in the return, global whitening."""

from __future__ import annotations

from typing import ClassVar

from agentenv.algorithms.estimators import Estimator, get_estimator
from agentenv.algorithms.grpo.algorithm import GRPO
from agentenv.algorithms.reinforce_pp.config import ReinforcePPConfig


class ReinforcePP(GRPO):
    """REINFORCE++ (Hu, 2025): outcome reward and per-token KL in the return, normalized over the global batch."""

    config_cls: ClassVar[type] = ReinforcePPConfig
    estimator_name: ClassVar[str] = "reinforce_pp"

    def __init__(self, cfg: ReinforcePPConfig | None = None):
        super().__init__(cfg or ReinforcePPConfig())

    def estimator(self) -> Estimator:
        return get_estimator(self.estimator_name)


class ReinforcePPBaseline(ReinforcePP):
    """REINFORCE++-baseline: the group's mean reward subtracted before the KL and the global whitening."""

    estimator_name: ClassVar[str] = "reinforce_pp_baseline"
