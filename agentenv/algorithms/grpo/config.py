"""The GRPO family's validated configs, layered so that each algorithm's config has exactly the keys it reads.

    GroupConfig             group_size, clip_low, clip_high            every member (GSPO: its sequence loss)
    └─ TokenLossConfig      + kl_coef, rollout_correction*, off_policy  the clipped token loss (Dr. GRPO)
       └─ MeanLossConfig    + loss_agg                                  ... with its mean chosen (RLOO)
          └─ GRPOConfig     + normalize_std                             GRPO, and DAPO, ARPO, GiGPO, REINFORCE++

A variant that fixes what the family lets others choose (RLOO's unscaled
advantage, GSPO's lack of a KL term) declares the fixed value as a class
attribute and the key in `fixed_keys`: a config that asks for that value is
accepted as before, any other value is refused with the reason (`agentenv.loader.build_dataclass`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentenv.errors import ConfigError
from agentenv.loader import check_number


@dataclass(frozen=True)
class GroupConfig:
    """What every algorithm of the family sets: the group and the ratio's clip range.

    Attributes:
        group_size: G, trajectories sampled independently per task (the ARPO
            paper's "rollouts per task": 16).
        clip_low: PPO ratio clip below 1 (ratio >= 1 - clip_low).
        clip_high: PPO ratio clip above 1 (ratio <= 1 + clip_high); a larger value
            than clip_low is DAPO's "clip-higher".
    """

    group_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ConfigError("algorithm.group_size", f"must be >= 2 to compare trajectories, got {self.group_size}")
        for key in ("clip_low", "clip_high"):
            v = getattr(self, key)
            if not (0.0 < v < 1.0 or (key == "clip_high" and 0.0 < v < 10.0)):
                raise ConfigError(f"algorithm.{key}", f"must be a positive clip range, got {v}")


@dataclass(frozen=True)
class TokenLossConfig(GroupConfig):
    """The clipped token loss's settings (`agentenv.algorithms.core.policy_loss`): the KL term and the off-policy corrections.

    Attributes:
        kl_coef: Weight of the k3 KL penalty to the reference model; 0 turns it
            off and no reference model is loaded (the ARPO paper's setting).
        rollout_correction: Off-policy correction between the sampler's
            per-token logprobs (vLLM's, or the hf backend's) and the trainer's,
            with rho = pi_trainer / pi_sampler: `none`; `tis`, truncated
            importance sampling, weighs each token's policy-gradient loss by
            min(rho, C) (Yao et al., 2025); `mis`, masked importance sampling,
            by rho where rho <= C and 0 beyond (Liu et al., 2025). As TRL's
            `vllm_importance_sampling_mode` and verl's `rollout_is`. The
            mismatch (`train/mismatch_kl`, `train/is_ratio_max`) is logged either way.
        rollout_correction_level: `token` (rho per token) or `sequence` (the
            product of a trajectory's token ratios, on each of its tokens).
        rollout_correction_cap: C, the cap on rho (> 1; verl's default 2; TRL's default is now 3.0).
        off_policy: `none`, or `decoupled`: AReaL's decoupled PPO objective (Fu
            et al., 2025) for asynchronous training (`trainer.max_staleness`):
            the ratio is clipped around the proximal policy (the old logprobs
            the trainer recomputes under its current weights) and each token's
            loss is weighed by pi_proximal / pi_behaviour (the sampler's
            logprobs, from the version that sampled it). Exclusive with
            `rollout_correction`, which weighs by the same ratio, truncated or masked.
        behaviour_weight_cap: Under `decoupled`, tokens whose pi_proximal /
            pi_behaviour exceeds this cap get weight 0 (they still count in the
            normalizer; AReaL's `behav_imp_weight_cap`); None: no cap.
    """

    kl_coef: float = 0.0
    rollout_correction: Literal["none", "tis", "mis"] = "none"
    rollout_correction_level: Literal["token", "sequence"] = "token"
    rollout_correction_cap: float = 2.0
    off_policy: Literal["none", "decoupled"] = "none"
    behaviour_weight_cap: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("algorithm.kl_coef", self.kl_coef, low_ok=True)
        check_number("algorithm.rollout_correction_cap", self.rollout_correction_cap, low=1.0)
        if self.off_policy == "decoupled" and self.rollout_correction != "none":
            raise ConfigError(
                "algorithm.off_policy",
                f"'decoupled' weighs each token by pi_proximal / pi_behaviour already; set "
                f"algorithm.rollout_correction to 'none' (got {self.rollout_correction!r}), or use it instead",
            )
        if self.behaviour_weight_cap is not None:
            check_number("algorithm.behaviour_weight_cap", self.behaviour_weight_cap, low=1.0)


@dataclass(frozen=True)
class MeanLossConfig(TokenLossConfig):
    """The clipped token loss with its mean chosen.

    Attributes:
        loss_agg: `token_mean` (every policy token weighs the same, DAPO) or
            `seq_mean_token_mean` (each trajectory weighs the same, GRPO). Either
            mean is over the whole mini-batch (`trainer.mini_batch_tasks`), across
            its micro-batches and processes; failed trajectories count in neither.
    """

    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"


@dataclass(frozen=True)
class GRPOConfig(MeanLossConfig):
    """Group Relative Policy Optimization (Shao et al., 2024, DeepSeekMath).

    The group, clip, KL, correction and mean fields: `GroupConfig`,
    `TokenLossConfig`, `MeanLossConfig`.

    Attributes:
        normalize_std: Divide group-centred rewards by the group's std. False
            gives Dr. GRPO's mean-centred advantage (Liu et al., 2025).
    """

    normalize_std: bool = True
