"""GiGPO's validated config, and its form on ARPO's trees."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from agentenv.algorithms.arpo.config import ARPOConfig
from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.errors import ConfigError

Anchors = Literal["key", "similarity"]
EpisodeWeighting = Literal["trajectory", "step"]


@dataclass(frozen=True)
class StepConfig:
    """GiGPO's step level (Feng et al., 2025, arXiv 2505.10978), on GRPO's groups or on ARPO's trees.

    Attributes:
        gamma: γ, the discount of the step returns R_t = Σ_k γ^k r_(t+k) (eq. 5;
            the paper: 0.95). With agentenv's reward at the end only, R_t =
            γ^(T-1-t)·r: an early step that led to the answer counts less than
            the last one.
        step_advantage_weight: ω, the step-level advantage's weight in
            A = A^E + ω·A^S (eq. 8; the paper: 1).
        anchors: How steps are found to start from the same state. `key`: equal
            state keys (`Trajectory.state_keys`, which `AgentEnv` records as a
            hash of the context; a trajectory whose env gave none gets the same
            hash computed from its tokens): exact. `similarity`: verl-agent's
            fallback for states that rarely repeat exactly, steps whose contexts after
            the prompt match with a `difflib` ratio >= `similarity_threshold`.
        similarity_threshold: The ratio for `anchors: similarity`, in (0, 1)
            (verl-agent's `similarity_thresh`: 0.95 in its code, 0.9 in its search script).
    """

    gamma: float = 0.95
    step_advantage_weight: float = 1.0
    anchors: Anchors = "key"
    similarity_threshold: float = 0.95

    def check_steps(self) -> None:
        """The step fields' checks (called by the configs that mix them in, after their own base's)."""
        if not (math.isfinite(self.gamma) and 0.0 <= self.gamma <= 1.0):
            raise ConfigError("algorithm.gamma", f"must be a discount in [0, 1], got {self.gamma}")
        if not (math.isfinite(self.step_advantage_weight) and self.step_advantage_weight >= 0.0):
            raise ConfigError(
                "algorithm.step_advantage_weight", f"must be a finite number >= 0, got {self.step_advantage_weight}"
            )
        if not (0.0 < self.similarity_threshold < 1.0):
            raise ConfigError(
                "algorithm.similarity_threshold", f"must be in (0, 1) (1 is anchors: key), got {self.similarity_threshold}"
            )


@dataclass(frozen=True)
class GiGPOConfig(StepConfig, GRPOConfig):
    """Group-in-Group Policy Optimization (Feng et al., 2025, arXiv 2505.10978).

    Symbols are the paper's. The step level's fields are `StepConfig`'s, the
    others GRPO's (`GRPOConfig`): `group_size` (N, trajectories per task; the
    paper: 8), `clip_low`, `clip_high`, `loss_agg`, `kl_coef`, the rollout correction.

    Attributes:
        normalize_std: F_norm of eqs. 3 and 7, at both levels: True divides by
            the group's std (verl-agent's `mode: mean_std_norm`, its example
            scripts' setting), False only subtracts the mean (`mean_norm`).
        episode_weighting: Over what the episode-level mean and std (eq. 3) are
            taken: `trajectory` (the paper's eq. 3 and GRPO's: one reward per
            trajectory) or `step` (verl-agent's code, `compute_mean_std_cross_steps`:
            each trajectory's reward once per step, so long trajectories weigh more).
    """

    episode_weighting: EpisodeWeighting = "trajectory"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_steps()


@dataclass(frozen=True)
class TreeGiGPOConfig(StepConfig, ARPOConfig):
    """GiGPO's step-level advantage on ARPO's entropy-guided trees (`algorithm.name: arpo_gigpo`).

    The tree's fields are ARPO's (`ARPOConfig`: `group_size` M, `initial_rollouts`
    N, `forks_per_branch` Z, α, β, τ, ...), the step-level ones GiGPO's
    (`StepConfig`: `gamma`, `step_advantage_weight`, `anchors`, `similarity_threshold`). The
    episode-level advantage is ARPO's (`advantage`: `soft` or `hard`, over the
    tree's M trajectories, `estimator` `grpo` or `dr_grpo`), so GiGPO's
    `episode_weighting` is `trajectory` (accepted at that value, refused at
    others). The branches of a branch point start from one state, so they
    share an anchor group by construction.
    """

    episode_weighting: ClassVar[str] = "trajectory"
    fixed_keys: ClassVar[dict[str, str]] = {
        "episode_weighting": "on a tree the episode advantage is ARPO's, one reward per trajectory"
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_steps()
        if self.advantage == "hard_once":
            raise ConfigError(
                "algorithm.advantage",
                "hard_once is not supported with GiGPO's step advantage: a shared token counted once would keep "
                "only its carrier's step advantage; use soft or hard",
            )
        if self.estimator not in ("grpo", "dr_grpo"):
            raise ConfigError(
                "algorithm.estimator", f"must be 'grpo' or 'dr_grpo' for arpo_gigpo, got {self.estimator!r}"
            )
