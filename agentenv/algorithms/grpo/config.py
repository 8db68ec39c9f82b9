"""GRPO's validated config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentenv.errors import ConfigError


@dataclass(frozen=True)
class GRPOConfig:
    """Group Relative Policy Optimization (Shao et al., 2024, DeepSeekMath).

    Attributes:
        group_size: G, trajectories sampled independently per task (the ARPO
            paper's "rollouts per task": 16).
        normalize_std: Divide group-centred rewards by the group's std. False
            gives Dr. GRPO's mean-centred advantage (Liu et al., 2025).
        clip_low: PPO ratio clip below 1 (ratio >= 1 - clip_low).
        clip_high: PPO ratio clip above 1 (ratio <= 1 + clip_high); a larger value
            than clip_low is DAPO's "clip-higher".
        loss_agg: `token_mean` (every policy token weighs the same, DAPO) or
            `seq_mean_token_mean` (each trajectory weighs the same, GRPO).
        kl_coef: Weight of the k3 KL penalty to the reference model; 0 turns it
            off and no reference model is loaded (the ARPO paper's setting).
    """

    group_size: int = 8
    normalize_std: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ConfigError("algorithm.group_size", f"must be >= 2 to compare trajectories, got {self.group_size}")
        for key in ("clip_low", "clip_high"):
            v = getattr(self, key)
            if not (0.0 < v < 1.0 or (key == "clip_high" and 0.0 < v < 10.0)):
                raise ConfigError(f"algorithm.{key}", f"must be a positive clip range, got {v}")
        if self.loss_agg not in ("token_mean", "seq_mean_token_mean"):
            raise ConfigError(
                "algorithm.loss_agg", f"must be 'token_mean' or 'seq_mean_token_mean', got {self.loss_agg!r}"
            )
        if self.kl_coef < 0:
            raise ConfigError("algorithm.kl_coef", f"must be >= 0, got {self.kl_coef}")
