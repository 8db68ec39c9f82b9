"""DAPO's validated config."""

from __future__ import annotations

from dataclasses import dataclass

from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.errors import ConfigError
from agentenv.loader import check_number


@dataclass(frozen=True)
class DAPOConfig(GRPOConfig):
    """Decoupled Clip and Dynamic sAmpling Policy Optimization (Yu et al., 2025, arXiv 2503.14476).

    The other fields are GRPO's (`GRPOConfig`): `group_size`, `normalize_std`
    (DAPO keeps GRPO's group-normalized advantage), the rollout correction.

    Attributes:
        clip_low: epsilon_low, the ratio's clip below 1 (the paper: 0.2).
        clip_high: epsilon_high, the ratio's clip above 1 (the paper's
            "clip-higher": 0.28); at least clip_low.
        loss_agg: The paper's token-level loss, `token_mean` (every policy token
            of the mini-batch weighs the same).
        kl_coef: The paper drops the KL penalty: 0.
        dynamic_sampling: Drop groups whose valid trajectories all have the same
            reward (zero advantage: no gradient) and sample more tasks until the
            step's batch is full (the paper's dynamic sampling).
        max_resample_rounds: Cap on the extra rounds of sampling in one step
            (as verl's DAPO recipe's `max_num_gen_batches`); when it is reached,
            the remaining slots take dropped groups (zero advantage). Counts are
            logged: `rollout/resample_rounds`, `rollout/dropped_groups`, `rollout/filled_groups`.
        overlong_filter: Leave trajectories cut by a token budget (finish
            `length`: a turn hit `policy.max_turn_tokens`; `context`: the episode
            hit `env.max_context_tokens`) out of the loss (the paper's overlong
            filtering); they still count in their group's statistics.
        overlong_penalty: Add the paper's soft overlong punishment to the
            reward before the group advantage: 0 up to L_max - L_cache policy
            tokens, then falling linearly to -1 at L_max, -1 beyond.
        overlong_max_tokens: L_max, in policy tokens a trajectory generated (the paper: 20480).
        overlong_cache_tokens: L_cache, the length of the linear ramp (the paper: 4096); 0 < L_cache <= L_max.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    dynamic_sampling: bool = True
    max_resample_rounds: int = 3
    overlong_filter: bool = True
    overlong_penalty: bool = False
    overlong_max_tokens: int = 20480
    overlong_cache_tokens: int = 4096

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clip_high < self.clip_low:
            raise ConfigError(
                "algorithm.clip_high",
                f"must be >= clip_low {self.clip_low} (DAPO's clip-higher: the paper 0.2 / 0.28), got {self.clip_high}",
            )
        check_number("algorithm.max_resample_rounds", self.max_resample_rounds, low_ok=True, integer=True)
        check_number("algorithm.overlong_max_tokens", self.overlong_max_tokens, integer=True)
        check_number("algorithm.overlong_cache_tokens", self.overlong_cache_tokens, integer=True)
        if self.overlong_cache_tokens > self.overlong_max_tokens:
            raise ConfigError(
                "algorithm.overlong_cache_tokens",
                f"L_cache {self.overlong_cache_tokens} must not exceed overlong_max_tokens L_max {self.overlong_max_tokens}",
            )
