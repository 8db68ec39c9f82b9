"""RLOO's validated config."""

from __future__ import annotations

from dataclasses import dataclass

from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.errors import ConfigError


@dataclass(frozen=True)
class RLOOConfig(GRPOConfig):
    """REINFORCE Leave-One-Out (Ahmadian et al., 2024, arXiv 2402.14740; Kool et al., 2019).

    The other fields are GRPO's (`GRPOConfig`): `group_size` (k, samples per
    prompt; the paper: 2 to 4), `clip_low`, `clip_high` (the PPO clipped
    surrogate, as TRL's and verl's RLOO), `loss_agg`, `kl_coef`, the rollout
    correction.

    Attributes:
        normalize_std: Must stay False: RLOO's baseline is the mean of the
            other samples' rewards, A_i = r_i - mean_{j != i} r_j, unscaled.
    """

    normalize_std: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.normalize_std:
            raise ConfigError("algorithm.normalize_std", "must be false for rloo: its advantage is r_i - mean_{j != i} r_j")
