"""Dr. GRPO's validated config."""

from __future__ import annotations

from dataclasses import dataclass

from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.errors import ConfigError
from agentenv.loader import check_number


@dataclass(frozen=True)
class DrGRPOConfig(GRPOConfig):
    """GRPO Done Right (Liu et al., 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783).

    The other fields are GRPO's (`GRPOConfig`): `group_size`, `clip_low`,
    `clip_high`, `kl_coef`, the rollout correction. `loss_agg` is not used: the
    loss is Dr. GRPO's constant normalizer.

    Attributes:
        normalize_std: Must stay False: Dr. GRPO removes the std from the group
            advantage (its "question-level difficulty bias"), A_i = r_i - mean(r).
        loss_constant: The constant each sequence's summed token loss is divided
            by, instead of its own length (its "response-level length bias"): the
            loss is sum over policy tokens / (sequences * loss_constant), as TRL's
            `loss_type="dr_grpo"` (`max_completion_length`) and verl's
            `seq-mean-token-sum` divided by the constant (verl's
            `seq-mean-token-sum-norm` differs from it by the number of
            sequences). The paper uses the generation budget;
            a value near the policy tokens of a long trajectory keeps the loss's
            scale near GRPO's.
    """

    normalize_std: bool = False
    loss_constant: float = 512.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.normalize_std:
            raise ConfigError("algorithm.normalize_std", "must be false for dr_grpo: its advantage is r - mean(r)")
        check_number("algorithm.loss_constant", self.loss_constant)
