"""GSPO's validated config."""

from __future__ import annotations

from dataclasses import dataclass

from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.errors import ConfigError


@dataclass(frozen=True)
class GSPOConfig(GRPOConfig):
    """Group Sequence Policy Optimization (Zheng et al., 2025, arXiv 2507.18071).

    The other fields are GRPO's (`GRPOConfig`): `group_size`, `normalize_std`
    (GSPO's advantage is GRPO's group-normalized one). `loss_agg` is not used:
    the loss is a mean over sequences.

    Attributes:
        clip_low: The sequence ratio's clip below 1 (the paper: 3e-4); a
            sequence-level, length-normalized ratio stays near 1, so GSPO's
            ranges are about a thousand times smaller than GRPO's token ones.
        clip_high: The sequence ratio's clip above 1 (the paper: 4e-4).
        kl_coef: Must be 0 (GSPO trains without a KL term).
        rollout_correction: Must be `none` (the sequence ratio is not reweighted here).
    """

    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kl_coef != 0:
            raise ConfigError("algorithm.kl_coef", f"must be 0 for gspo (it has no KL term), got {self.kl_coef}")
        if self.rollout_correction != "none":
            raise ConfigError(
                "algorithm.rollout_correction", f"must be 'none' for gspo, got {self.rollout_correction!r}"
            )
        if self.off_policy != "none":
            raise ConfigError("algorithm.off_policy", f"must be 'none' for gspo (its sequence loss), got {self.off_policy!r}")
