"""RLOO as an algorithm plugin: GRPO's sampler and clipped loss, the leave-one-out baseline."""

from __future__ import annotations

from typing import ClassVar

from agentenv.algorithms.estimators import Estimator, get_estimator
from agentenv.algorithms.grpo.algorithm import GRPO
from agentenv.algorithms.rloo.config import RLOOConfig


class RLOO(GRPO):
    """RLOO (Ahmadian et al., 2024): each sample's baseline is the mean reward of the others."""

    config_cls: ClassVar[type] = RLOOConfig

    def __init__(self, cfg: RLOOConfig | None = None):
        super().__init__(cfg or RLOOConfig())

    def estimator(self) -> Estimator:
        return get_estimator("rloo")
