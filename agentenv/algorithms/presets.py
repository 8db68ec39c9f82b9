"""Algorithms that are GRPO with another estimator or loss, as presets: a config class and the registered names.

RLOO, Dr. GRPO and REINFORCE++ (and REINFORCE++-baseline) share GRPO's
independent sampler; each names its advantage estimator and its policy loss
(`agentenv.algorithms.core`): RLOO and REINFORCE++ GRPO's `clipped` loss,
Dr. GRPO its constant normalizer, `dr_grpo`. Each is registered under its own name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentenv.algorithms.grpo import GRPO, GRPOConfig, MeanLossConfig, TokenLossConfig
from agentenv.loader import check_number

_NO_STD = "its advantage is not divided by a std"


@dataclass(frozen=True)
class RLOOConfig(MeanLossConfig):
    """REINFORCE Leave-One-Out (Ahmadian et al., 2024, arXiv 2402.14740; Kool et al., 2019).

    Its fields are GRPO's clipped token loss's (`MeanLossConfig`): `group_size`
    (k, samples per prompt; the paper: 2 to 4), `clip_low`, `clip_high` (the
    PPO clipped surrogate, as TRL's and verl's RLOO), `loss_agg`, `kl_coef`, the
    rollout correction. Each sample's baseline is the mean of the others'
    rewards, A_i = r_i - mean_{j != i} r_j, unscaled: `normalize_std` is False
    (the key is accepted at false, refused at true).
    """

    normalize_std: ClassVar[bool] = False
    fixed_keys: ClassVar[dict[str, str]] = {"normalize_std": f"rloo: {_NO_STD} (r_i - mean_{{j != i}} r_j)"}


@dataclass(frozen=True)
class DrGRPOConfig(TokenLossConfig):
    """GRPO Done Right (Liu et al., 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783).

    The other fields are GRPO's clipped token loss's (`TokenLossConfig`):
    `group_size`, `clip_low`, `clip_high`, `kl_coef`, the rollout correction.
    Dr. GRPO removes the std from the group advantage (its "question-level
    difficulty bias"), A_i = r_i - mean(r): `normalize_std` is False (the key is
    accepted at false, refused at true). `loss_agg` is not a key: the loss's
    normalizer is `loss_constant`.

    Attributes:
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

    loss_constant: float = 512.0

    normalize_std: ClassVar[bool] = False
    fixed_keys: ClassVar[dict[str, str]] = {
        "normalize_std": f"dr_grpo: {_NO_STD} (r - mean(r))",
        "loss_agg": "dr_grpo's loss divides the token sum by sequences * loss_constant: set loss_constant",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("algorithm.loss_constant", self.loss_constant)


@dataclass(frozen=True)
class ReinforcePPConfig(GRPOConfig):
    """REINFORCE++ (Hu, 2025, arXiv 2501.03262), and its `-baseline` variant.

    The other fields are GRPO's (`GRPOConfig`): `group_size` (samples per
    prompt), `clip_low`, `clip_high` (the PPO clipped surrogate; the paper:
    0.2), `loss_agg`, the rollout correction.

    Attributes:
        kl_coef: beta, the per-token k1 KL penalty to the reference model folded
            into the token-level return, G_t = r - beta * sum_{s >= t} KL_s (the
            paper: 0.01 for RLHF; 0 loads no reference model). It is not also a
            KL term in the loss.
        normalize_std: Divide the returns by their std over the global batch
            (every policy token of every process) after subtracting the global
            mean (the paper's advantage normalization); False only centres them.
    """

    kl_coef: float = 0.01
    normalize_std: bool = True


class RLOO(GRPO):
    """RLOO (Ahmadian et al., 2024): each sample's baseline is the mean reward of the others."""

    config_cls: ClassVar[type] = RLOOConfig
    estimator_name: ClassVar[str] = "rloo"


class DrGRPO(GRPO):
    """Dr. GRPO (Liu et al., 2025): GRPO without the std in the advantage and without length normalization."""

    config_cls: ClassVar[type] = DrGRPOConfig
    estimator_name: ClassVar[str] = "dr_grpo"
    loss_name: ClassVar[str] = "dr_grpo"  # the constant normalizer


class ReinforcePP(GRPO):
    """REINFORCE++ (Hu, 2025): outcome reward and per-token KL in the return, normalized over the global batch."""

    config_cls: ClassVar[type] = ReinforcePPConfig
    estimator_name: ClassVar[str] = "reinforce_pp"


class ReinforcePPBaseline(ReinforcePP):
    """REINFORCE++-baseline: the group's mean reward subtracted before the KL and the global whitening."""

    estimator_name: ClassVar[str] = "reinforce_pp_baseline"
